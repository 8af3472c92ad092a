"""`kvpilot serve`: load the model, start the engine loop, serve the API with uvicorn.

Every way start-up can fail ends in one log line and a termination message naming the reason
(kvpilot_common.termination), and cheap checks (API keys) run before the model loads.
"""

import argparse
import logging
import os
import sys
from typing import NoReturn

from kvpilot_common import termination
from kvpilot_common.http.serving import draining_server, http_config
from kvpilot_server.engine_args import engine_config

log = logging.getLogger("kvpilot")


def run_serve(args: argparse.Namespace) -> NoReturn:
    """Serve until drained, then end the process at once: the engine has stopped (its
    tensor-parallel workers told to), the logs and the termination message are written, and
    what is left of an interpreter's shutdown is torch deregistering its operators, most of a
    second that every pod's termination, scale-down and restart would wait out."""
    code = _serve_until_drained(args)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve_until_drained(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from kvpilot_common.errors import ConfigError, KvpilotError
    from kvpilot_common.http.keys import load_key_book

    try:
        keys = load_key_book(args.api_key_file)
        lora_modules = _lora_settings(args)
    except ConfigError as exc:
        return _cannot_start(termination.INVALID_CONFIGURATION, exc)
    from kvpilot_server.engine.runtime.async_engine import AsyncEngine

    try:
        config = engine_config(args)
        lora = bool(lora_modules) or args.lora_dir is not None or args.lora_config is not None
        config.enable_lora = config.enable_lora or lora
        engine = AsyncEngine.from_config(config).start()
    except KvpilotError as exc:
        return _cannot_start(termination.MODEL_LOAD_FAILED, exc)
    try:
        return _serve(args, engine, config.model, keys, lora_modules)
    except KvpilotError as exc:  # an adapter of --lora-modules that cannot be served
        return _cannot_start(termination.MODEL_LOAD_FAILED, exc)
    except Exception as exc:  # e.g. the port is taken: the pod must say why, not just exit
        log.exception("server failed")
        return _cannot_start(termination.STARTUP_FAILED, exc)
    finally:
        engine.shutdown()


def _lora_settings(args: argparse.Namespace) -> dict[str, str]:
    """--lora-modules as {name: path}, after checking the run-time flags go together."""
    from kvpilot_common.errors import ConfigError
    from kvpilot_server.api.adapters import parse_modules

    if args.allow_runtime_lora_updating != (args.lora_dir is not None):
        raise ConfigError("--allow-runtime-lora-updating and --lora-dir go together")
    if min(args.max_loaded_adapters, args.max_adapters_per_tenant) < 0:
        raise ConfigError("--max-loaded-adapters and --max-adapters-per-tenant are 0 or more")
    try:
        return parse_modules(args.lora_modules)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _serve(args: argparse.Namespace, engine, model: str, keys, lora_modules: dict[str, str]) -> int:
    import asyncio
    from pathlib import Path

    from kvpilot_common import trust
    from kvpilot_server.api.app import ServerSettings, build_app

    settings = ServerSettings(
        served_model_name=args.served_model_name or model,
        api_keys=keys,
        max_waiting=args.max_waiting,
        request_timeout=args.request_timeout,
        context_overflow=args.context_overflow,
        body_timeout=args.body_timeout,
        tool_call_parser=args.tool_call_parser,
        lora_dir=Path(args.lora_dir) if args.lora_dir is not None else None,
        lora_config=Path(args.lora_config) if args.lora_config is not None else None,
        gateway_secret=trust.secret_from_env(),
    )
    app = build_app(engine, settings)
    app.state.adapters.max_loaded = args.max_loaded_adapters
    app.state.adapters.max_per_tenant = args.max_adapters_per_tenant
    app.state.adapters.modules = frozenset(lora_modules)
    for name, path in lora_modules.items():
        asyncio.run(app.state.adapters.add(name, path))
        log.info("LoRA adapter %s loaded from %s", name, path)
    if app.state.adapter_sync is not None:  # what the list names, before the pod is Ready
        asyncio.run(app.state.adapter_sync.once())
    config = http_config(app, args)
    server = draining_server()(config, app.state.admission, args.drain_timeout)
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when it cannot start (it logged why)
        if server.started:
            raise
        raise RuntimeError(f"cannot listen on {args.host}:{args.port}") from None
    return 0


def _cannot_start(reason: str, exc: Exception) -> int:
    log.error("cannot start: %s", exc)
    termination.write(reason, str(exc))
    return 1
