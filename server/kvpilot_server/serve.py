"""`kvpilot serve`: load the model, start the engine loop, serve the API with uvicorn."""

import argparse
import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from kvpilot_server.engine_args import engine_config


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kvpilot_server.api.admission import Admission
    from kvpilot_server.api.app import build_app
    from kvpilot_server.api.auth import load_api_keys

    DrainingServer = _draining_server()
    from kvpilot_server.engine.async_engine import AsyncEngine
    from kvpilot_server.errors import KvpilotError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = engine_config(args)
        engine = AsyncEngine.from_config(config).start()
    except KvpilotError as exc:
        logging.getLogger("kvpilot").error("cannot start: %s", exc)
        _write_termination_message(f"ModelLoadFailed: {exc}")
        return 1
    name = args.served_model_name or config.model
    keys = load_api_keys(args.api_key_file)
    try:
        admission = Admission(args.max_waiting, args.request_timeout)
        app = build_app(engine, name, keys, admission, args.context_overflow)
        # kvpilot.access logs each request as JSON; uvicorn's text access log would repeat it.
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level="info", access_log=False
        )
        DrainingServer(config, admission, args.drain_timeout).run()
    finally:
        engine.shutdown()
    return 0


def _write_termination_message(message: str) -> None:
    """Kubernetes shows this file's text as the container's termination message, which is how
    the operator reports why a model failed to load. Outside a pod the file does not exist."""
    path = Path(os.environ.get("KVPILOT_TERMINATION_LOG", "/dev/termination-log"))
    if path.exists():
        with contextlib.suppress(OSError):
            path.write_text(message[:4000])  # Kubernetes keeps at most 4096 bytes


def _draining_server():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On the first SIGTERM/SIGINT keep serving while in-flight requests finish (new ones
        get 503 and /ready fails, so Kubernetes stops routing here), then exit; a second
        signal exits at once."""

        def __init__(self, config, admission, drain_timeout: float) -> None:
            super().__init__(config)
            self.admission, self.drain_timeout = admission, drain_timeout

        def handle_exit(self, sig, frame) -> None:
            if self.admission.draining:
                super().handle_exit(sig, frame)
                return
            self.admission.draining = True
            # Signal handlers run on the event loop's thread, between its callbacks.
            asyncio.get_event_loop().call_soon_threadsafe(
                lambda: asyncio.ensure_future(self._drain())
            )

        async def _drain(self) -> None:
            deadline = time.monotonic() + self.drain_timeout
            while self.admission.in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self.should_exit = True

    return DrainingServer
