"""The request bodies the gateway keeps in memory at once, bounded in bytes.

Every body costs its bytes from its first chunk until its replica has answered (or the request
has ended): while it is read, while it is held for a model that is starting, while it is sent;
and, for the moment of its parse, what the parse will build (target.parse_cost). Counting only
held requests would leave concurrent uploads unbounded; counting requests only (--max-held)
would let each of them be 4 MiB. Past the bound a request gets 429 with Retry-After, as a full
hold does; one whose parse alone would exceed the whole bound gets 413.
"""

import contextlib
from collections.abc import Iterator

from kvpilot_common.errors import OverloadedError, PayloadTooLargeError

RETRY_AFTER_SECONDS = 1  # bodies leave as soon as replicas answer: seconds, not minutes


class Lease:
    """One request's share; add() as its bytes arrive."""

    def __init__(self, budget: "BodyBudget") -> None:
        self.budget, self.size = budget, 0

    def add(self, size: int) -> None:
        budget = self.budget
        if budget.used + size > budget.limit:
            raise OverloadedError(
                f"The gateway holds {budget.limit} bytes of request bodies at most, and is "
                "full; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        budget.used += size
        self.size += size

    @contextlib.contextmanager
    def borrowed(self, size: int) -> Iterator[None]:
        """`size` more for the duration of the block (a parse's objects)."""
        if size > self.budget.limit:
            raise PayloadTooLargeError(
                f"Request body holds too many JSON values to route: parsing it would take "
                f"about {size >> 20} MiB, more than the gateway's {self.budget.limit >> 20} MiB "
                "for request bodies"
            )
        self.add(size)
        try:
            yield
        finally:
            self.size -= size
            self.budget.used -= size


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        lease = Lease(self)
        try:
            yield lease
        finally:
            self.used -= lease.size
