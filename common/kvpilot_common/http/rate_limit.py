"""Requests and tokens per minute, per tenant: a token bucket for each, refilled continuously.

A request is admitted when its tenant's request bucket holds a whole request and its token
bucket is not in debt. Tokens are charged when a response's usage is known (its end); the
tenant then waits until a debt is repaid, and Retry-After says how long. Charged only at the
end, a burst of concurrent requests would all be admitted and overdraw the bucket by all their
answers at once; so a caller that can estimate a request's tokens before it runs (kvpilot's
gateway, once it has read the body) reserves them: reserve() takes them while the bucket is not
in debt, refusing otherwise, and the end charges the difference. The overdraw is then about one
request's reservation (as OpenAI's limiter, which counts max_tokens at admission).

Refusals are 429 with `Retry-After` (whole seconds, rounded up: the next request after it is
admitted) and `retry-after-ms` (which the openai client honours first); every response of a
limited tenant carries OpenAI's `x-ratelimit-*` headers.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpilot_common.http.keys import Key

WINDOW_S = 60.0  # the limits are per minute


@dataclass
class Bucket:
    capacity: float
    level: float
    stamp: float

    def refill(self, capacity: float, now: float) -> None:
        """Up to `capacity` (the limit may have changed since: a lower one cuts the level)."""
        rate = capacity / WINDOW_S
        self.capacity = capacity
        self.level = min(capacity, self.level + (now - self.stamp) * rate)
        self.stamp = now

    def wait_for(self, level: float) -> float:
        """Seconds until the bucket holds `level`."""
        return max(0.0, (level - self.level) * WINDOW_S / self.capacity)


@dataclass
class Verdict:
    retry_after: float | None  # None: admitted
    limit: str | None = None  # "requests" or "tokens": what refused it
    headers: dict[str, str] = field(default_factory=dict)


def duration(seconds: float) -> str:
    """As OpenAI writes its resets: 120ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


class RateLimits:
    """Every tenant's buckets. One per listener, used from its event loop only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.buckets: dict[tuple[str, str], Bucket] = {}

    def admit(self, key: Key) -> Verdict:
        now = self.clock()
        requests = self._bucket(key.tenant, "requests", key.rpm, now)
        tokens = self._bucket(key.tenant, "tokens", key.tpm, now)
        waits = {}
        if requests is not None and requests.level < 1:
            waits["requests"] = requests.wait_for(1)
        if tokens is not None and tokens.level < 0:
            waits["tokens"] = tokens.wait_for(0)
        if waits:
            limit = max(waits, key=waits.__getitem__)
            return Verdict(waits[limit], limit, self._headers(requests, tokens))
        if requests is not None:
            requests.level -= 1
        return Verdict(None, None, self._headers(requests, tokens))

    def charge(self, key: Key, tokens: int) -> None:
        """`tokens` used (negative: a reservation's surplus given back)."""
        bucket = self._bucket(key.tenant, "tokens", key.tpm, self.clock())
        if bucket is not None:
            bucket.level -= tokens

    def reserve(self, tenant: str, tokens: int) -> float | None:
        """Take `tokens` from an admitted tenant's token bucket ahead of its answer, unless the
        bucket is in debt now (requests admitted meanwhile reserved it): then the seconds until
        it is not, and nothing is taken. Checked and taken at once (one event loop, no await),
        so each reservation starts from a bucket out of debt and overdraws it by its own tokens
        at most. None too for a tenant without a tokens limit."""
        bucket = self.buckets.get((tenant, "tokens"))
        if bucket is None:
            return None
        bucket.refill(bucket.capacity, self.clock())  # the limit admit() saw, moments ago
        if bucket.level < 0:
            return bucket.wait_for(0)
        bucket.level -= tokens
        return None

    def _bucket(self, tenant: str, kind: str, limit: int | None, now: float) -> Bucket | None:
        if limit is None:
            return None
        bucket = self.buckets.get((tenant, kind))
        if bucket is None:
            bucket = self.buckets[(tenant, kind)] = Bucket(limit, limit, now)
        bucket.refill(limit, now)
        return bucket

    @staticmethod
    def _headers(requests: Bucket | None, tokens: Bucket | None) -> dict[str, str]:
        headers = {}
        for kind, bucket in (("requests", requests), ("tokens", tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(int(bucket.capacity))
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(bucket.level)))
                headers[f"x-ratelimit-reset-{kind}"] = duration(bucket.wait_for(bucket.capacity))
        return headers


def refusal_headers(verdict: Verdict) -> dict[str, str]:
    assert verdict.retry_after is not None
    return {
        **verdict.headers,
        "Retry-After": str(max(1, math.ceil(verdict.retry_after))),
        "retry-after-ms": str(max(1, math.ceil(verdict.retry_after * 1000))),
    }
