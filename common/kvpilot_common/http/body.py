"""Reading and parsing a request body without trusting the client.

The size limit is enforced while the body streams in (a declared Content-Length is checked
before reading anything), so a huge upload costs at most the limit in memory. A client that
stalls mid-body is cut off after --body-timeout seconds of silence. Parsing uses pydantic's own
JSON parser, which refuses what json.loads would let through to fail later as a 500: lone
surrogates, NaN and Infinity, integers beyond the parser's range and absurd nesting depth.
"""

import asyncio
from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request

from kvpilot_common.errors import BodyTimeoutError, PayloadTooLargeError
from kvpilot_common.http.limits import MAX_BODY_BYTES


async def read_body(
    request: Request,
    timeout: float | None,
    limit: int = MAX_BODY_BYTES,
    reserve: Callable[[int], None] | None = None,
) -> bytes:
    """The whole body. `reserve(n)` is told each chunk's size before it is kept (the gateway
    bounds the bytes of all bodies it holds) and may raise to refuse it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"Request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), timeout)
        except TimeoutError:
            raise BodyTimeoutError(
                f"The request body was not received in time (no data for {timeout:g} s)"
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"Request body exceeds {limit} bytes")
        if reserve is not None:
            reserve(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
