"""What the autoscaler learns from arrivals: their trend, their noise, and what one replica
serves. Pure: numbers in, numbers out; decide() turns them into replicas and words.

- The trend is a Theil-Sen slope (the median of the slopes between every pair of samples): one
  spike or one missed scrape moves a median of pairs little, where a least-squares line or the
  last two samples would swing with it.
- The noise is the residuals' median absolute deviation around that line, scaled to a standard
  deviation: a ripple of a few requests per second shows up here, not as a trend.
- Capacity is learned from the replicas' own latency. Each steady window gives a point: the
  load per replica x (arrivals over ready replicas) and the latency ratio r (p95 over its
  target; queue over its target if higher). Queueing latency grows like 1 / (1 - x / limit)
  above a floor, so 1 / r falls in a line with x; a Theil-Sen line through the points, solved
  for r = aim, is what one replica serves at the aim. With loads too alike to fit a line, the
  median of x * aim / r (exact at the aim, high below it: a controller sized by it loads the
  replicas toward the aim, where the next points correct it).
"""

import math
import statistics
from dataclasses import dataclass, field

Point = tuple[float, float]  # (time, requests per second)

# Latency says how loaded a replica is only in steady state: past 1.5 x its target a backlog
# (not the rate) sets it, and the window's p95 no longer describes the load.
LEARN_RATIO = (0.2, 1.5)
LEARN_POINTS = 40  # (load, ratio) points kept: one per window, so the last 40 windows
LEARN_SPREAD = 0.1  # the loads must span this share of their median for a line to be fitted
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@dataclass(frozen=True)
class Memory:
    """What decide() remembers besides its recommendations, kept in status.autoscaling."""

    arrivals: list[Point] = field(default_factory=list)  # (time, arrivals/s), newest last
    points: list[Point] = field(default_factory=list)  # (requests/s per replica, ratio)
    capacity: float | None = None  # requests/s one replica serves at the aim; None: not learned
    panic_until: float | None = None  # a burst was seen: no scale-down before this time
    changed_at: float | None = None  # the last scale: the window before it saw other replicas
    learned_at: float | None = None  # the last point's time
    basis: str = ""  # the Inputs.basis the points were measured under

    def to_status(self) -> dict:
        return {
            "arrivals": [[round(t, 3), round(r, 3)] for t, r in self.arrivals],
            "loadPoints": [[round(x, 4), round(r, 4)] for x, r in self.points],
            "capacity": None if self.capacity is None else round(self.capacity, 4),
            "panicUntil": self.panic_until,
            "changedAt": self.changed_at,
            "learnedAt": self.learned_at,
            "basis": self.basis,
        }

    @classmethod
    def from_status(cls, state: dict) -> "Memory":
        keys = ("capacity", "panicUntil", "changedAt", "learnedAt")
        capacity, until, changed, learned = (state.get(k) for k in keys)
        return cls(
            arrivals=[(float(t), float(r)) for t, r in state.get("arrivals") or []],
            points=[(float(x), float(r)) for x, r in state.get("loadPoints") or []],
            capacity=None if capacity is None else float(capacity),
            panic_until=None if until is None else float(until),
            changed_at=None if changed is None else float(changed),
            learned_at=None if learned is None else float(learned),
            basis=state.get("basis") or "",
        )


def slope(points: list[Point]) -> float:
    """Theil-Sen: the median slope over all pairs (requests/s per second); 0 with fewer than
    two distinct times."""
    slopes = [(r2 - r1) / (t2 - t1) for (t1, r1), (t2, r2) in _pairs(points) if t2 > t1]
    return statistics.median(slopes) if slopes else 0.0


def agreement(points: list[Point], rise: float) -> float:
    """The share of pairs whose slope has the sign of `rise` (Kendall's concordance): near 1 for
    a trend, near a half for noise around a level."""
    pairs = [(a, b) for a, b in _pairs(points) if b[0] > a[0] and b[1] != a[1]]
    if not pairs or rise == 0:
        return 0.0
    same = sum(1 for (_, r1), (_, r2) in pairs if (r2 - r1) * rise > 0)
    return same / len(pairs)


def _pairs(points: list[Point]) -> list[tuple[Point, Point]]:
    return [(a, b) for i, a in enumerate(points) for b in points[i + 1 :]]


def noise(points: list[Point], rise: float) -> float:
    """A robust standard deviation of the arrivals around the trend line with slope `rise`."""
    if len(points) < 3:
        return 0.0
    residuals = [r - rise * t for t, r in points]
    centre = statistics.median(residuals)
    return MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in residuals)


def learnable(ratio: float) -> bool:
    return LEARN_RATIO[0] <= ratio <= LEARN_RATIO[1]


def capacity(points: list[Point], aim: float) -> float | None:
    """Requests/s one replica serves at the latency ratio `aim`, from (requests/s per replica,
    ratio) points; None without points."""
    if not points:
        return None
    # Too few points for a line: the ray through the origin (see the module's docstring).
    rays = statistics.median(x * aim / r for x, r in points)
    xs = [x for x, _ in points]
    middle = statistics.median(xs)
    if len(points) < 3 or (max(xs) - min(xs)) < LEARN_SPREAD * middle:
        return rays
    # Several loads: fit 1 / ratio against load (Theil-Sen) and solve for 1 / aim.
    inverse = [(x, 1 / r) for x, r in points]
    fall = slope(inverse)
    if fall >= 0:  # latency not rising with load in these points: no line to read
        return rays
    level = statistics.median(y - fall * x for x, y in inverse)
    solved = (1 / aim - level) / fall
    return min(max(solved, rays / 2), rays * 2)


def replicas_for(arrivals: float, capacity: float) -> int:
    """The fewest replicas that carry `arrivals` at `capacity` each."""
    return max(math.ceil(arrivals / capacity - 1e-9), 0)
