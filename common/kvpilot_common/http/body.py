"""Reading and parsing a request body without trusting the client.

The size limit is enforced while the body streams in (a declared Content-Length is checked
before reading anything), so a huge upload costs at most the limit in memory. A client that
stalls mid-body is cut off after --body-timeout seconds of silence; one that sends a byte just
before each silence ends would still hold its body's memory for as long as it liked, so a body
must also come at MIN_BODY_RATE on average once --body-timeout has passed (the slowloris
rule of Apache's mod_reqtimeout): a body of 4 MiB has --body-timeout plus two minutes.
Parsing uses pydantic's own JSON parser, which refuses what json.loads would let through to
fail later as a 500: lone surrogates, NaN and Infinity, integers beyond the parser's range and
absurd nesting depth.
"""

import asyncio
from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request

from kvpilot_common.errors import BodyTimeoutError, PayloadTooLargeError
from kvpilot_common.http.limits import MAX_BODY_BYTES

# Bytes a second a body must average after its first --body-timeout seconds: a 256 kbit/s
# uplink, far below any client's, far above a drip that holds memory to starve others.
MIN_BODY_RATE = 32 << 10


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
    clock = asyncio.get_running_loop().time
    start = clock()
    while True:
        # The silence allowed, and no more than what the minimum rate leaves of the whole.
        left = None if timeout is None else start + timeout + size / MIN_BODY_RATE - clock()
        wait = None if timeout is None or left is None else max(0.0, min(timeout, left))
        try:
            message = await asyncio.wait_for(request.receive(), wait)
        except TimeoutError:
            assert timeout is not None and left is not None
            if left >= timeout:
                raise BodyTimeoutError(
                    f"The request body was not received in time (no data for {timeout:g} s)"
                ) from None
            raise BodyTimeoutError(
                f"The request body came too slowly: {size} bytes in {clock() - start:.0f} s "
                f"(after the first {timeout:g} s, at least {MIN_BODY_RATE} bytes a second)"
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
