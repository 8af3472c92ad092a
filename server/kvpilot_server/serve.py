"""`kvpilot serve`: load the model, start the engine loop, serve the API with uvicorn."""

import argparse
import logging

from kvpilot_server.engine_args import engine_config


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kvpilot_server.api.admission import Admission
    from kvpilot_server.api.app import build_app
    from kvpilot_server.api.auth import load_api_keys
    from kvpilot_server.engine.async_engine import AsyncEngine
    from kvpilot_server.errors import KvpilotError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = engine_config(args)
    try:
        engine = AsyncEngine.from_config(config).start()
    except KvpilotError as exc:
        logging.getLogger("kvpilot").error("cannot start: %s", exc)
        return 1
    name = args.served_model_name or config.model
    keys = load_api_keys(args.api_key_file)
    try:
        admission = Admission(args.max_waiting, args.request_timeout)
        app = build_app(engine, name, keys, admission)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        engine.shutdown()
    return 0
