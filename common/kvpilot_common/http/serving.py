"""How a kvpilot listener runs under uvicorn, the server's and the gateway's alike: the protocol
that bounds the request line and headers, no text access log, and a drain on SIGTERM that
answers whatever it cuts in OpenAI's error shape."""

import argparse
import asyncio
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:  # annotations only: uvicorn is imported when a listener starts, not before
    import uvicorn
    from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Admission(Protocol):
    """What the drain reads and sets: the server's admission and the gateway's State."""

    draining: bool
    in_flight: int


# A DrainingServer's constructor: (uvicorn's config, the admission, the drain timeout in s).
ServerFactory = Callable[["uvicorn.Config", Admission, float], "uvicorn.Server"]


def http_config(app: "ASGIApp", args: argparse.Namespace, **overrides: Any) -> "uvicorn.Config":
    """uvicorn's settings for a kvpilot listener (the server's and the gateway's): the protocol
    that bounds the request line and headers in size and time (--header-timeout), and no text
    access log (kvpilot.access logs each request as JSON)."""
    import uvicorn

    from kvpilot_common.http.protocol import with_header_timeout

    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,
        http=with_header_timeout(args.header_timeout),
        **overrides,
    )


def draining_server() -> ServerFactory:
    """uvicorn's Server with a drain; `admission` is anything with `draining` and `in_flight`
    (the gateway drains the same way), and optionally `on_drain()`, called on the event loop
    when the drain starts (the gateway answers its held requests then), and
    `on_drain_timeout()`, called when the drain timeout passes with requests still in flight
    (the model server ends their streams with an error event then, rather than cutting them)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On the first SIGTERM/SIGINT keep serving while in-flight requests finish (new ones
        get 503 and /ready fails, so Kubernetes stops routing here), then exit: at the drain
        timeout at the latest, whatever is still open (uvicorn alone would wait for every
        connection, however long a stream runs). A second signal exits at once. A request cut
        before it answered gets a JSON 503 (answer_when_cut)."""

        def __init__(
            self, config: uvicorn.Config, admission: Admission, drain_timeout: float
        ) -> None:
            # What is left after the drain is cut, not waited for.
            config.timeout_graceful_shutdown = EXIT_GRACE_SECONDS
            if not isinstance(config.app, str):  # an import path is not ours to wrap
                config.app = answer_when_cut(cast("ASGIApp", config.app), admission)
            super().__init__(config)
            self.admission, self.drain_timeout = admission, drain_timeout

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
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
            await self._settle(self.drain_timeout)
            on_timeout = getattr(self.admission, "on_drain_timeout", None)
            if self.admission.in_flight > 0 and on_timeout is not None:
                on_timeout()
                await self._settle(EXIT_GRACE_SECONDS)  # for the last events to go out
            self.should_exit = True

        async def _settle(self, seconds: float) -> None:
            """Until nothing is in flight, for at most `seconds`."""
            deadline = time.monotonic() + seconds
            while self.admission.in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

    return DrainingServer


def answer_when_cut(app: "ASGIApp", admission: Admission) -> "ASGIApp":
    """`app`, with an answer for a request whose task uvicorn cancels at the end of a drain
    (EXIT_GRACE_SECONDS after the drain timeout) before it began its response: a 503 in
    OpenAI's shape that says why, where uvicorn would send a plain-text 500. A 503, as the
    server's streams cut by the drain end with (api/admission.py): this replica is going away,
    the request itself did not fail, and another replica can take it. Nothing is added to a
    response already begun: its connection is closed."""
    from kvpilot_common.http.errors import error_response

    async def guarded(scope: "Scope", receive: "Receive", send: "Send") -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = False

        async def tracked(message: "Message") -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, tracked)
        except asyncio.CancelledError:
            # Only uvicorn's shutdown cancels a request's task: with the drain on, it is ours.
            if started or not admission.draining:
                raise
            answer = error_response(503, CUT_MESSAGE, headers={"Connection": "close"})
            await answer(scope, receive, send)
            # Answered: returning (not raising) keeps uvicorn from logging a traceback for it.

    return guarded


CUT_MESSAGE = (
    "This replica is shutting down and its drain timeout passed before the request was "
    "answered; retry on another replica"
)
# After the drain (or with nothing in flight): uvicorn's own shutdown closes idle connections
# and waits at most this long for the rest before cancelling them.
EXIT_GRACE_SECONDS = 1
