"""Admission control: a bounded waiting queue and per-request deadlines.

A request is refused with 429 when the requests admitted but not yet running reach
--max-waiting; Retry-After estimates when a slot frees up from the recent completion rate.
Deadlines abort the request in the engine (its blocks are freed) and answer 408.
"""

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

from kvpilot_server.errors import DrainingError, OverloadedError, RequestTimeoutError

_RATE_WINDOW_S = 30.0
T = TypeVar("T")


class Admission:
    def __init__(self, max_waiting: int, request_timeout: float | None) -> None:
        self.max_waiting = max_waiting
        self.request_timeout = request_timeout
        self.in_flight = 0
        self.finished: deque[float] = deque(maxlen=1024)
        self.draining = False  # set on SIGTERM: /ready fails, new requests get 503

    def admit(self, running: int, slots: int = 1) -> None:
        """Take `slots` places (one per engine request) or refuse; track() gives them back."""
        if self.draining:
            raise DrainingError("The server is shutting down; retry on another replica")
        waiting = self.in_flight - running
        if waiting >= self.max_waiting:
            raise OverloadedError(
                f"Server is at capacity ({waiting} requests waiting, limit {self.max_waiting})",
                self.retry_after(waiting),
            )
        self.in_flight += slots

    def retry_after(self, waiting: int) -> int:
        now = time.monotonic()
        recent = sum(1 for t in self.finished if now - t <= _RATE_WINDOW_S)
        rate = recent / _RATE_WINDOW_S
        if rate == 0:
            return 5
        return min(60, max(1, math.ceil((waiting - self.max_waiting + 1) / rate)))

    async def track(
        self, stream: AsyncGenerator[T, None], timeout: float | None, slots: int = 1
    ) -> AsyncIterator[T]:
        """Pass outputs through; release the slot at the end and enforce the deadline."""
        timeout = timeout or self.request_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    output = await asyncio.wait_for(anext(stream), remaining)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    await stream.aclose()  # aborts the request in the engine
                    raise RequestTimeoutError(f"Request timed out after {timeout:g} s") from None
                yield output
        finally:
            self.in_flight -= slots
            self.finished.extend([time.monotonic()] * slots)
            await stream.aclose()
