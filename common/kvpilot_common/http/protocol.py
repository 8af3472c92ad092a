"""uvicorn's httptools protocol with a deadline and a size limit for the request line and
headers.

uvicorn times out idle keep-alive connections, but not a fresh connection that sends nothing,
nor one that sends part of its headers and stalls (slowloris): each would hold a socket and a
file descriptor forever. This protocol closes such connections after --header-timeout seconds
with a 408. Nor does httptools bound the headers: megabytes of them would be parsed and kept in
the request's scope, so more than MAX_HEADER_BYTES is a 431, counted both per header and in
raw bytes (httptools gathers one header's value in full before it reports it, so a single
endless header would otherwise grow without bound). Trailer fields of a chunked request never
join the request's headers: uvicorn would append them to the scope's header list after the app
had read it (the API key checked), where a proxy would forward them. Body reads are timed and
limited by the app (http/body.py), where the request is known. The gateway serves with this
same protocol.
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvpilot_common.http.limits import HEADER_TIMEOUT, MAX_HEADER_BYTES

_TOO_LARGE_RESPONSE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8"
    b"\r\ncontent-length: 30\r\nconnection: close\r\n\r\nRequest headers are too large\n"
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 34\r\nconnection: close\r\n\r\nRequest headers were not received\n"
)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout: float = HEADER_TIMEOUT  # set by with_header_timeout()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._raw_header_bytes = 0  # bytes received while a request's headers were incomplete
        self._in_headers = True
        self._headers_too_large = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a new connection owes us a request line

    def data_received(self, data: bytes) -> None:
        counted = self._in_headers
        if counted:
            self._raw_header_bytes += len(data)
        super().data_received(data)
        # Still inside the headers after this chunk: what httptools holds is at most this.
        over = counted and self._in_headers and self._raw_header_bytes > MAX_HEADER_BYTES
        if over and not self.transport.is_closing():
            self._headers_too_large = True
            self.send_400_response("request headers too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_headers:
            return  # a trailer field (after a chunked body): dropped, never a header
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            self._headers_too_large = True
            # httptools stops parsing and uvicorn answers through send_400_response.
            raise ValueError("request headers too large")

    def send_400_response(self, msg: str) -> None:
        if not self._headers_too_large:
            super().send_400_response(msg)
            return
        self._disarm()
        self.transport.write(_TOO_LARGE_RESPONSE)
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_headers = False
        self._raw_header_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True  # the next bytes on this connection are the next request's

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
