"""Admission control: a bounded waiting queue and per-request deadlines.

A request takes one slot per engine request (its n choices) for its whole life, through a
context manager, so every path out (error, disconnect, timeout, cancellation) gives them back.
It is refused with 429 when the requests that would have to wait exceed --max-waiting. That
count is what the engine really queues (its last stats snapshot) plus admitted requests it has
not picked up yet beyond its free seats: a burst that the engine has seats for is not refused.
Retry-After estimates when a slot frees up from the recent completion rate, spread at random
so that refused clients do not all come back at the same moment.

A full queue does not lock out a tenant that holds less than its share of it (--max-waiting
over the tenants with requests here): one tenant's flood would otherwise fill the queue and
every other tenant would get 429s before the engine's fairness could serve them. The queue then
holds at most twice --max-waiting.
"""

import asyncio
import contextlib
import math
import random
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TypeVar

from kvpilot_common.errors import (
    DrainingError,
    InvalidRequestError,
    OverloadedError,
    RequestTimeoutError,
)
from kvpilot_server.engine.runtime.llm_engine import EngineStats

_RATE_WINDOW_S = 30.0
_IDLE_RETRY_S = 5  # no completion seen lately: nothing to estimate from
_MAX_RETRY_S = 60
T = TypeVar("T")


class Admission:
    def __init__(
        self,
        max_waiting: int,
        request_timeout: float | None,
        stats: Callable[[], EngineStats] | None = None,
        max_num_seqs: int = 0,
        abandon: Callable[[DrainingError], None] | None = None,
    ) -> None:
        self.max_waiting = max_waiting
        self.request_timeout = request_timeout  # a ceiling: a request may ask for less
        self.stats, self.max_num_seqs = stats, max_num_seqs
        self.in_flight = 0  # engine requests admitted and not finished (one per choice)
        self.tenants: Counter[str] = Counter()  # the same, per tenant
        self.finished: deque[float] = deque(maxlen=1024)
        self.draining = False  # set on SIGTERM: /ready fails, new requests get 503
        self.abandon = abandon  # ends every request in flight with an error

    def on_drain_timeout(self) -> None:
        """The drain's time is up with requests in flight: each stream ends with a 503 error
        event that says why (a client, or a gateway, then knows to retry elsewhere) instead of
        a connection cut mid-body."""
        if self.abandon is not None:
            self.abandon(
                DrainingError(
                    "The server is shutting down and its drain timeout passed before this "
                    "request finished; retry on another replica"
                )
            )

    @contextlib.contextmanager
    def admit(self, slots: int = 1, tenant: str = "") -> Iterator[None]:
        """Hold `slots` places (one per engine request) for the block, or refuse."""
        if self.draining:
            raise DrainingError("The server is shutting down; retry on another replica")
        if self.stats is not None and slots > self.max_num_seqs + self.max_waiting:
            raise InvalidRequestError(
                f"n={slots} choices can never be admitted here: at most "
                f"{self.max_num_seqs + self.max_waiting} (max_num_seqs {self.max_num_seqs} + "
                f"max_waiting {self.max_waiting})",
                "n",
            )
        waiting = self.waiting_if_admitted(slots)
        if waiting > self.max_waiting and not self._under_share(slots, tenant, waiting):
            raise OverloadedError(
                f"Server is at capacity: {slots} more request(s) would make {waiting} wait, "
                f"limit {self.max_waiting}",
                self.retry_after(waiting),
            )
        self.in_flight += slots
        self.tenants[tenant] += slots
        try:
            yield
        finally:
            self.in_flight -= slots
            self.tenants[tenant] -= slots
            if not self.tenants[tenant]:
                del self.tenants[tenant]
            self.finished.extend([time.monotonic()] * slots)

    def _under_share(self, slots: int, tenant: str, waiting: int) -> bool:
        """Whether `tenant` holds less than its share of the queue, which is never more than
        twice full."""
        sharing = len(self.tenants) + (tenant not in self.tenants)
        if sharing == 1:  # one tenant: the queue is its own
            return False
        share = math.ceil(self.max_waiting / sharing)
        return waiting <= 2 * self.max_waiting and self.tenants[tenant] + slots <= share

    def waiting_if_admitted(self, slots: int) -> int:
        """Requests that would wait for the engine after taking `slots` more."""
        if self.stats is None:  # no engine view: everything in flight counts as waiting
            return self.in_flight + slots
        stats = self.stats()
        running, waiting = sum(stats.running.values()), sum(stats.waiting.values())
        unseen = max(0, self.in_flight - running - waiting)  # admitted, not yet in the engine
        free_seats = max(0, self.max_num_seqs - running - waiting)
        return waiting + max(0, unseen + slots - free_seats)

    def retry_after(self, waiting: int) -> int:
        now = time.monotonic()
        recent = sum(1 for t in self.finished if now - t <= _RATE_WINDOW_S)
        rate = recent / _RATE_WINDOW_S
        estimate = _IDLE_RETRY_S if rate == 0 else (waiting - self.max_waiting) / rate
        # Spread over [estimate, 2 x estimate]: a synchronized retry would be refused again.
        # Retry-After is whole seconds, so the spread is at least [1, 2] s and rounded, not
        # ceiled: an estimate under a second (completions arriving fast) rounded every refused
        # client to 1 s, and ceil gave every one 2 s, the very synchronized retry the spread is
        # there to prevent.
        spread = max(1.0, estimate) * (1.0 + random.random())
        return min(_MAX_RETRY_S, max(1, round(spread)))

    def deadline(self, requested: float | None) -> float | None:
        """The request's timeout: what it asked for, never more than the server's ceiling."""
        if requested is None or self.request_timeout is None:
            return requested or self.request_timeout
        return min(requested, self.request_timeout)

    async def timed(
        self, stream: AsyncGenerator[T, None], timeout: float | None
    ) -> AsyncIterator[T]:
        """Pass outputs through until the deadline, then abort the stream and raise a 408."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    output = await asyncio.wait_for(anext(stream), remaining)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise RequestTimeoutError(f"Request timed out after {timeout:g} s") from None
                yield output
        finally:
            await stream.aclose()  # aborts the engine requests if they are still running
