"""`kvpilot serve`: load the model, start the engine loop, serve the API with uvicorn.

Every way start-up can fail ends in one log line and a termination message naming the reason
(kvpilot_server.termination), and cheap checks (API keys) run before the model loads.
"""

import argparse
import asyncio
import logging
import time

from kvpilot_server import termination
from kvpilot_server.engine_args import engine_config

log = logging.getLogger("kvpilot")


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from kvpilot_server.api.auth import load_api_keys
    from kvpilot_server.errors import ConfigError, KvpilotError

    try:
        keys = load_api_keys(args.api_key_file)
    except ConfigError as exc:
        return _cannot_start(termination.INVALID_CONFIGURATION, exc)
    from kvpilot_server.engine.runtime.async_engine import AsyncEngine

    try:
        config = engine_config(args)
        engine = AsyncEngine.from_config(config).start()
    except KvpilotError as exc:
        return _cannot_start(termination.MODEL_LOAD_FAILED, exc)
    try:
        return _serve(args, engine, config.model, keys)
    except Exception as exc:  # e.g. the port is taken: the pod must say why, not just exit
        log.exception("server failed")
        return _cannot_start(termination.STARTUP_FAILED, exc)
    finally:
        engine.shutdown()


def _serve(args: argparse.Namespace, engine, model: str, keys: list[str]) -> int:
    from kvpilot_server.api.app import ServerSettings, build_app

    settings = ServerSettings(
        served_model_name=args.served_model_name or model,
        api_keys=keys,
        max_waiting=args.max_waiting,
        request_timeout=args.request_timeout,
        context_overflow=args.context_overflow,
        body_timeout=args.body_timeout,
    )
    app = build_app(engine, settings)
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


def http_config(app, args: argparse.Namespace, **overrides):
    """uvicorn's settings for a kvpilot listener (the server's and the gateway's): the protocol
    that bounds the request line and headers in size and time (--header-timeout), and no text
    access log (kvpilot.access logs each request as JSON)."""
    import uvicorn

    from kvpilot_server.api.http_protocol import with_header_timeout

    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,
        http=with_header_timeout(args.header_timeout),
        **overrides,
    )


def draining_server():
    """uvicorn's Server with a drain; `admission` is anything with `draining` and `in_flight`
    (the gateway drains the same way), and optionally `on_drain()`, called on the event loop
    when the drain starts (the gateway answers its held requests then)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On the first SIGTERM/SIGINT keep serving while in-flight requests finish (new ones
        get 503 and /ready fails, so Kubernetes stops routing here), then exit: at the drain
        timeout at the latest, whatever is still open (uvicorn alone would wait for every
        connection, however long a stream runs). A second signal exits at once."""

        def __init__(self, config, admission, drain_timeout: float) -> None:
            # What is left after the drain is cut, not waited for.
            config.timeout_graceful_shutdown = EXIT_GRACE_SECONDS
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
            on_drain = getattr(self.admission, "on_drain", None)
            if on_drain is not None:
                on_drain()
            deadline = time.monotonic() + self.drain_timeout
            while self.admission.in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self.should_exit = True

    return DrainingServer


# After the drain (or with nothing in flight): uvicorn's own shutdown closes idle connections
# and waits at most this long for the rest before cancelling them.
EXIT_GRACE_SECONDS = 1
