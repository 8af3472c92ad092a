"""uvicorn's httptools protocol with a deadline for the request line and headers.

uvicorn times out idle keep-alive connections, but not a fresh connection that sends nothing,
nor one that sends part of its headers and stalls (slowloris): each would hold a socket and a
file descriptor forever. This protocol closes such connections after --header-timeout seconds
with a 408. Body reads are timed by the app (api/body.py), where the request is known.
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 34\r\nconnection: close\r\n\r\nRequest headers were not received\n"
)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0  # set by with_header_timeout()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a new connection owes us a request line

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # Between requests uvicorn's own keep-alive timeout applies; ours restarts with the
        # next request's first byte (on_message_begin).
        self._disarm()
        super().on_response_complete()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # a pipelined request waits for the current response: time it after
            return
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn.Config(http=...), with this deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
