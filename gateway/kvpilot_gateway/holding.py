"""Requests for a model with no ready replica wait here until one is ready: bounded per model
and in total (over the bound: 429 with Retry-After at once, as a full server queue answers),
each for at most the hold timeout (then 503: the model is still starting). Every change of a
model's count goes to the announcer, so the operator scales it up while the request waits.
A model deleted meanwhile ends its holds with 404 at once; so does the gateway's drain, with
503 and Retry-After (another gateway replica can take them), rather than let them wait out
the hold on a process that is about to exit."""

import asyncio
import math
import time
from collections.abc import Callable

from kvpilot_common.errors import ModelNotFoundError, OverloadedError, UnavailableError
from kvpilot_gateway.catalog import Catalog, Key, Model
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_gateway.options import Settings

# A replica marked down after a failed connection comes back with the next good scrape, which
# no watch event announces: look again at least this often.
RECHECK_SECONDS = 0.5


class StartingError(UnavailableError):
    """The hold timed out: 503, and the client may come back later."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Holds:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        announce: Callable[[Key, int], None],
        metrics: GatewayMetrics,
    ) -> None:
        self.settings, self.catalog, self.announce, self.metrics = (
            settings,
            catalog,
            announce,
            metrics,
        )
        self.held: dict[Key, int] = {}
        self.total = 0
        self.closed = asyncio.Event()  # set by close(): the drain began

    def close(self) -> None:
        """Every hold ends now with StartingError (503, Retry-After 1), and no new one starts."""
        self.closed.set()

    def _count(self, model: Key, delta: int) -> None:
        held = self.held.get(model, 0) + delta
        self.held[model] = held
        if held == 0:
            del self.held[model]
        self.total += delta
        self.metrics.held.labels(*model).set(held)
        self.announce(model, held)

    async def until_ready(self, model: Model, ready: Callable[[], list[str]]) -> list[str]:
        """The model's usable endpoints once there are some. OverloadedError over the bounds,
        StartingError past the hold timeout; a cancelled wait (the client left) is released."""
        key, limit = model.key, self.settings.max_held_per_model
        if self.closed.is_set():
            raise self._draining(model)
        if self.held.get(key, 0) >= limit or self.total >= self.settings.max_held:
            which = f"{limit} for this model" if self.held.get(key, 0) >= limit else "in all"
            raise OverloadedError(
                f"Too many requests are waiting for {model.served!r} to start "
                f"(at most {which}); retry later",
                retry_after=max(1, math.ceil(self.settings.hold_timeout / 10)),
            )
        self._count(key, +1)
        start = time.monotonic()
        deadline = start + self.settings.hold_timeout
        outcome = "timeout"
        try:
            while True:
                endpoints = ready()
                if endpoints:
                    outcome = "ready"
                    return endpoints
                if key not in self.catalog.models:
                    outcome = "deleted"
                    raise ModelNotFoundError(
                        f"The model {model.served!r} was deleted while the request waited"
                    )
                if self.closed.is_set():
                    outcome = "draining"
                    raise self._draining(model)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StartingError(
                        f"The model {model.served!r} is starting: no replica became ready "
                        f"within {self.settings.hold_timeout:g} s; retry later",
                        retry_after=max(1, math.ceil(self.settings.hold_timeout / 10)),
                    )
                changed = self.catalog.changed(key)
                waits = [asyncio.ensure_future(e.wait()) for e in (changed, self.closed)]
                try:
                    await asyncio.wait(waits, timeout=min(remaining, RECHECK_SECONDS))
                finally:
                    for wait in waits:
                        wait.cancel()
        except asyncio.CancelledError:
            outcome = "client_closed"
            raise
        finally:
            self._count(key, -1)
            self.metrics.hold_seconds.labels(*key, outcome).observe(time.monotonic() - start)

    @staticmethod
    def _draining(model: Model) -> StartingError:
        return StartingError(
            f"This gateway replica is shutting down; retry the request for {model.served!r}",
            retry_after=1,
        )
