"""The request bodies the gateway keeps in memory at once, bounded in bytes, in all and per
holder.

Every body costs its bytes from its first chunk until its replica has answered (or the request
has ended): while it is read, while it is held for a model that is starting, while it is sent;
and, for the moment of its parse, what the parse will build (target.parse_cost). Counting only
held requests would leave concurrent uploads unbounded; counting requests only (--max-held)
would let each of them be 4 MiB. Past the bound a request gets 429 with Retry-After, as a full
hold does; one whose parse alone would exceed the whole bound gets 413.

One pool for everyone could be filled by one tenant: a few connections sending bodies of
nearly 4 MiB, then a byte now and then, would starve every other tenant of the gateway. So
each holder (the API key's tenant; without keys, the client's address) may hold a share of the
pool at most (--max-held-bytes-per-tenant): a tenant is refused at its own share, and the pool
is full only when several tenants each fill theirs. How long a slow body may take is
http/body.py's (a minimum rate): together they bound both how much and how long.
"""

import contextlib
import ipaddress
from collections.abc import Iterator

from kvpilot_common.errors import OverloadedError, PayloadTooLargeError
from kvpilot_common.http.limits import MAX_BODY_BYTES

RETRY_AFTER_SECONDS = 1  # bodies leave as soon as replicas answer: seconds, not minutes


class Lease:
    """One request's share; add() as its bytes arrive."""

    def __init__(self, budget: "BodyBudget", holder: str) -> None:
        self.budget, self.holder, self.size = budget, holder, 0

    def add(self, size: int, own: bool = True) -> None:
        """`own`: counted against the holder's share too (a body's bytes, not a parse's)."""
        budget = self.budget
        held = budget.held.get(self.holder, 0)
        if own and held + size > budget.share:
            raise OverloadedError(
                f"Your requests' bodies fill the {budget.share} bytes one tenant may have in "
                "the gateway's memory at once; retry when one of them has been answered",
                retry_after=RETRY_AFTER_SECONDS,
            )
        if budget.used + size > budget.limit:
            raise OverloadedError(
                f"The gateway holds {budget.limit} bytes of request bodies at most, and is "
                "full; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        budget.used += size
        if own:
            budget.held[self.holder] = held + size
            self.size += size

    def release(self) -> None:
        """Everything the body holds, at the request's end."""
        budget = self.budget
        budget.used -= self.size
        left = budget.held.get(self.holder, 0) - self.size
        if left > 0:
            budget.held[self.holder] = left
        else:
            budget.held.pop(self.holder, None)  # only holders with bytes in keep an entry
        self.size = 0

    @contextlib.contextmanager
    def borrowed(self, size: int) -> Iterator[None]:
        """`size` more for the duration of the block (a parse's objects): from the pool only,
        for the moment a parse takes, so a body's parse never counts against its tenant."""
        if size > self.budget.limit:
            raise PayloadTooLargeError(
                f"Request body holds too many JSON values to route: parsing it would take "
                f"about {size >> 20} MiB, more than the gateway's {self.budget.limit >> 20} MiB "
                "for request bodies"
            )
        self.add(size, own=False)
        try:
            yield
        finally:
            self.budget.used -= size


def tenant_share(limit: int, given: int | None) -> int:
    """What one holder may hold of `limit` (--max-held-bytes-per-tenant, `given`); ValueError
    saying why when it cannot be. By default a quarter, so that it takes several tenants, each
    at its share, to fill the gateway; never less than one whole body, nor more than all."""
    share = given or min(limit, max(limit // 4, MAX_BODY_BYTES))
    if not min(MAX_BODY_BYTES, limit) <= share <= limit:
        raise ValueError(
            f"--max-held-bytes-per-tenant {share}: from the largest body ({MAX_BODY_BYTES}, "
            f"or all of --max-held-bytes if less) to --max-held-bytes ({limit})"
        )
    return share


def holder(tenant: str, client: tuple[str, int] | None) -> str:
    """Whose share a request takes: its tenant, or without API keys, the address it came from,
    an IPv6 one by its /64, which one host holds whole (behind a proxy, every client of that
    proxy shares one: a gateway open to several parties has keys)."""
    if tenant:
        return tenant
    address = client[0] if client else "unknown"
    if ":" in address:
        with contextlib.suppress(ValueError):
            address = str(ipaddress.ip_network(f"{address}/64", strict=False))
    return "address " + address


class BodyBudget:
    def __init__(self, limit: int, share: int | None = None) -> None:
        self.limit, self.used = limit, 0
        self.share = limit if share is None else share
        self.held: dict[str, int] = {}  # holder -> bytes it holds now

    @contextlib.contextmanager
    def lease(self, holder: str = "") -> Iterator[Lease]:
        lease = Lease(self, holder)
        try:
            yield lease
        finally:
            lease.release()
