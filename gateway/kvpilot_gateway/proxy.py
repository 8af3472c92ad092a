"""Forwarding one request to one replica and its answer back, byte for byte as it arrives.

Nothing is buffered: a stream's events reach the client as the replica writes them. The client
leaving (before the replica answered, or mid-stream) closes the upstream connection at once,
which makes the replica abort the request and free its KV cache. A replica that breaks
mid-stream ends a stream with an error event in OpenAI's shape, as the server itself ends one
whose request failed; any other body is cut, so the client sees it incomplete.
"""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from kvpilot_server.api.errors import error_response

# Per hop: never forwarded (RFC 9110 7.6.1), and Host/length are the hop's own.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
T = TypeVar("T")


def forward_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.decode("latin-1").lower() not in HOP_HEADERS]


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body was read already: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> T:
    """`work`'s result; ClientDisconnect (and `work` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientDisconnect()


def error_event(message: str) -> bytes:
    body = json.loads(error_response(502, message).body)
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


# What breaks an upstream exchange: aiohttp's own errors, a timeout, the socket itself.
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class Passthrough:
    """The ASGI response that relays an upstream aiohttp response whose body is still to read.
    `done(outcome)` runs once at the end: ok, client_closed or upstream_error."""

    def __init__(self, upstream: aiohttp.ClientResponse, done: Callable[[str], None]) -> None:
        self.upstream, self.done = upstream, done
        content_type = upstream.headers.get("content-type", "")
        self.sse = content_type.startswith("text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = "upstream_error"
        headers = forward_headers(list(self.upstream.raw_headers))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.upstream.status,
                    "headers": headers,
                }
            )
            relay = asyncio.ensure_future(self._relay(send))
            left = asyncio.ensure_future(until_disconnect(receive))
            await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
            if not relay.done():  # the client went away: stop reading the replica
                relay.cancel()
                outcome = "client_closed"
                await asyncio.gather(relay, return_exceptions=True)
                return
            left.cancel()
            outcome = relay.result()
            if outcome == "upstream_error" and not self.sse:
                raise ConnectionError("the replica closed the connection mid-body")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if outcome == "ok":
                self.upstream.release()  # read to its end: the connection is reused
            else:
                self.upstream.close()  # the replica sees the connection close and aborts
            self.done(outcome)

    async def _relay(self, send: Send) -> str:
        try:
            async for chunk in self.upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_ERRORS:
            if self.sse:
                event = error_event("The model replica failed mid-stream; retry the request")
                await send({"type": "http.response.body", "body": event, "more_body": True})
            return "upstream_error"
        return "ok"


async def open_upstream(
    client: aiohttp.ClientSession,
    endpoint: str,
    path: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> aiohttp.ClientResponse:
    """Send the request; the response with its headers, its body still to read. Header
    values are passed through as received (latin-1, as HTTP carries them)."""
    forwarded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in forward_headers(headers)]
    return await client.post(f"http://{endpoint}{path}", data=body, headers=forwarded)
