"""What the autoscaler learns from arrivals: their trend, their noise, and what one replica
serves. Pure: numbers in, numbers out; decide() turns them into replicas and words.

- The trend is a Theil-Sen slope (the median of the slopes between every pair of samples): one
  spike or one missed scrape moves a median of pairs little, where a least-squares line or the
  last two samples would swing with it.
- The noise is the residuals' median absolute deviation around that line, scaled to a standard
  deviation: a ripple of a few requests per second shows up here, not as a trend.
- Capacity is learned where the replicas' latency says how loaded they are. If n replicas carry
  the arrivals a at a latency ratio r (p95 over its target; queue over its target if higher),
  a / n x aim / r is what one replica would carry at the aim. Sized by that figure, n settles
  where r equals the aim whatever the shape of the latency curve: a figure too high loads the
  replicas past the aim, and the next samples bring it down (and the other way round).
"""

import math
import statistics
from dataclasses import dataclass, field

Point = tuple[float, float]  # (time, requests per second)

# Learning needs the latency ratio near the aim: the sample extrapolates linearly along a
# latency curve that is not linear (far below the aim latency is mostly service time, far above
# it a backlog sets it), so a sample taken far from the aim is biased.
LEARN_AROUND_AIM = (-0.3, 0.2)
LEARN_WEIGHT = (
    0.05  # each steady window's share: the learned figure moves over minutes, not with a ripple
)
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@dataclass(frozen=True)
class Memory:
    """What decide() remembers besides its recommendations, kept in status.autoscaling."""

    arrivals: list[Point] = field(default_factory=list)  # (time, arrivals/s), newest last
    capacity: float | None = None  # requests/s one replica serves at the aim; None: not learned
    panic_until: float | None = None  # a burst was seen: no scale-down before this time
    changed_at: float | None = None  # the last scale: the window before it saw other replicas

    def to_status(self) -> dict:
        return {
            "arrivals": [[round(t, 3), round(r, 3)] for t, r in self.arrivals],
            "capacity": None if self.capacity is None else round(self.capacity, 4),
            "panicUntil": self.panic_until,
            "changedAt": self.changed_at,
        }

    @classmethod
    def from_status(cls, state: dict) -> "Memory":
        capacity, until, changed = (state.get(k) for k in ("capacity", "panicUntil", "changedAt"))
        return cls(
            arrivals=[(float(t), float(r)) for t, r in state.get("arrivals") or []],
            capacity=None if capacity is None else float(capacity),
            panic_until=None if until is None else float(until),
            changed_at=None if changed is None else float(changed),
        )


def slope(points: list[Point]) -> float:
    """Theil-Sen: the median slope over all pairs (requests/s per second); 0 with fewer than
    two distinct times."""
    slopes = [(r2 - r1) / (t2 - t1) for (t1, r1), (t2, r2) in _pairs(points) if t2 > t1]
    return statistics.median(slopes) if slopes else 0.0


def _pairs(points: list[Point]) -> list[tuple[Point, Point]]:
    return [(a, b) for i, a in enumerate(points) for b in points[i + 1 :]]


def noise(points: list[Point], rise: float) -> float:
    """A robust standard deviation of the arrivals around the trend line with slope `rise`."""
    if len(points) < 3:
        return 0.0
    residuals = [r - rise * t for t, r in points]
    centre = statistics.median(residuals)
    return MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in residuals)


def learn(
    capacity: float | None, arrivals: float, replicas: int, ratio: float, aim: float
) -> float | None:
    """The capacity after one steady window (None: nothing to learn from it)."""
    below, above = LEARN_AROUND_AIM
    if replicas <= 0 or arrivals <= 0 or not aim + below <= ratio <= aim + above:
        return capacity
    sample = arrivals / replicas * aim / ratio
    if capacity is None:
        return sample
    sample = min(max(sample, capacity / 2), capacity * 2)  # one odd window moves it little
    return capacity + LEARN_WEIGHT * (sample - capacity)


def replicas_for(arrivals: float, capacity: float) -> int:
    """The fewest replicas that carry `arrivals` at `capacity` each."""
    return max(math.ceil(arrivals / capacity - 1e-9), 0)
