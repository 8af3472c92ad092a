"""Reading and parsing a request body without trusting the client.

The size limit is enforced while the body streams in (a declared Content-Length is checked
before reading anything), so a huge upload costs at most the limit in memory. A client that
stalls mid-body is cut off after --body-timeout seconds of silence. Parsing uses pydantic's own
JSON parser, which refuses what json.loads would let through to fail later as a 500: lone
surrogates, NaN and Infinity, integers beyond the parser's range and absurd nesting depth.
"""

import asyncio

from starlette.requests import ClientDisconnect, Request

from kvpilot_server.errors import BodyTimeoutError, PayloadTooLargeError

MAX_BODY_BYTES = 4 << 20


async def read_body(request: Request, timeout: float | None, limit: int = MAX_BODY_BYTES) -> bytes:
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
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
