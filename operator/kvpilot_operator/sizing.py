"""Replicas from demand: the arrivals projected to when new pods would be ready, divided by what
one replica serves within target (forecast.py learns both). Pure, like decide(), which calls it
and falls back to scaling on latency and queue ratios until a capacity has been learned.

Why project: a pod asked for now serves one start-up time later, so a controller that sizes for
the load it sees is one start-up behind on every rise. The horizon is half the window (the
window's mean describes its middle), the pods' observed start-up and one interval.

Why a panic mode (Knative's KPA has one, AIBrix too): a burst shows in the short window before
the stable window's mean moves, so demand over the short window at `threshold` times the stable
window's scales up at once, and nothing scales down for a window after the last such sign.
Requests held at a gateway are demand the pods have not seen: they count in the short window.

Why a dead band: arrivals ripple, and a count that follows every ripple across a replica
boundary flaps. Scaling down needs demand below the smaller count by three times the arrivals'
noise (capped at one replica's capacity), so a ripple smaller than a replica moves nothing;
scaling up needs no margin, since the target is what users feel.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvpilot_operator import forecast
from kvpilot_operator.forecast import Memory
from kvpilot_operator.spec import Autoscaling

if TYPE_CHECKING:  # decide.py imports this module
    from kvpilot_operator.decide import Inputs


TREND_AGREEMENT = 0.8  # the share of sample pairs that must rise (or fall) together
ARRIVALS_KEPT = 200  # arrival samples kept at most


@dataclass(frozen=True)
class Sized:
    replicas: int | None  # None: no capacity learned yet (the memory still moves on)
    reason: str  # what drove it, in words, before the ": 2 -> 4" decide() adds
    memory: Memory
    panic: bool  # a burst now: scale up at once
    dwell: float = 0.0  # seconds of lower recommendations before a scale-down
    steady: bool = False  # the window's latency describes the replicas now serving


def trend_seconds(scaling: Autoscaling, startup: float) -> float:
    """How far back the arrivals trend looks: a start-up and a window, at least two windows.
    Shorter follows ripple; longer sees a ramp late."""
    return max(2 * scaling.window_seconds, startup + scaling.window_seconds)


def noise_seconds(scaling: Autoscaling, startup: float) -> float:
    """How far back the arrivals' noise is measured: long enough to hold a few periods of a
    ripple that one window's mean does not smooth away."""
    return max(10 * scaling.window_seconds, 2 * trend_seconds(scaling, startup))


def remember(
    memory: Memory, arrivals: float, now: float, scaling: Autoscaling, startup: float
) -> Memory:
    keep = noise_seconds(scaling, startup)
    points = [(t, r) for t, r in memory.arrivals if now - t < keep and t < now]
    # Bounded whatever the spans: status holds them, and the slope compares every pair.
    return replace(memory, arrivals=[*points, (now, arrivals)][-ARRIVALS_KEPT:])


def steady(inputs: "Inputs", memory: Memory, scaling: Autoscaling, now: float) -> bool:
    """Whether the window's latency describes the replicas now serving: all of them ready and
    scraped for a whole window since the pods of the last change could be ready (a start-up
    after it), and no burst under way."""
    since = (inputs.startup_seconds or 0.0) + scaling.window_seconds
    settled = memory.changed_at is None or now - memory.changed_at >= since
    calm = memory.panic_until is None or now >= memory.panic_until
    return (
        settled
        and calm
        and not inputs.starting
        and not inputs.scrape_failures
        and inputs.pods_scraped == inputs.current
    )


def _learn(
    memory: Memory, load: float, ratio: float, aim: float, now: float, window: int
) -> Memory:
    """A steady window's point, at most one per window (so the points span the last
    forecast.LEARN_POINTS windows, not a few minutes of one load), and the capacity refitted."""
    if memory.learned_at is not None and now - memory.learned_at < window:
        return memory
    points = [*memory.points, (load, ratio)][-forecast.LEARN_POINTS :]
    fitted = forecast.capacity(points, aim)
    return replace(memory, points=points, capacity=fitted, learned_at=now)


def _dwell(scaling: Autoscaling, noise: float) -> float:
    """How long lower demand must last before a scale-down: one window for smooth arrivals, up
    to scaleDown.stabilizationSeconds as their noise nears a replica's capacity (`noise`: the
    dead band over the capacity, 0 to 1)."""
    longest = scaling.scale_down.stabilization_seconds
    shortest = min(scaling.window_seconds, longest)
    return shortest + (longest - shortest) * min(max(noise, 0.0), 1.0)


def size(
    inputs: "Inputs", scaling: Autoscaling, memory: Memory, ratio: float, now: float
) -> Sized | None:
    """Replicas for the demand ahead (None: no arrivals measured, so nothing to size from).
    `ratio` is the worse of latency and queue over their targets."""
    arrivals = inputs.arrivals
    if arrivals is None:
        return None
    window, interval = scaling.window_seconds, scaling.interval_seconds
    startup = inputs.startup_seconds or 0.0
    aim = 1 - scaling.tolerance_percent / 100
    if memory.basis != inputs.basis:
        # Another target, model or engine: what one replica served before says nothing now.
        memory = replace(memory, points=[], capacity=None, learned_at=None, basis=inputs.basis)
    memory = remember(memory, arrivals, now, scaling, startup)
    settled = steady(inputs, memory, scaling, now)
    if settled and forecast.learnable(ratio) and arrivals > 0:
        memory = _learn(memory, arrivals / inputs.pods_scraped, ratio, aim, now, window)
    capacity, seeded = memory.capacity, ""
    seed = scaling.replica_capacity_requests_per_minute
    if capacity is None and seed:
        # The spec's figure holds p95 at its target: a point at ratio 1 until one is measured.
        capacity, seeded = forecast.capacity([(seed / 60, 1.0)], aim), " (from the spec)"
    if capacity is None or capacity <= 0:
        return Sized(None, "", memory, False)
    span = trend_seconds(scaling, startup)
    trend = [(t, r) for t, r in memory.arrivals if now - t < span]
    rise = forecast.slope(trend)
    spread = forecast.noise(memory.arrivals, forecast.slope(memory.arrivals))
    band = min(3 * spread, capacity)
    short = (inputs.recent_arrivals or 0.0) + inputs.held / interval
    burst = short >= scaling.panic.threshold_percent / 100 * max(arrivals, 1e-9)
    panicking = burst or (memory.panic_until is not None and now < memory.panic_until)
    # Project only a trend: one that most pairs of samples agree on and that moves by more than
    # the noise band over its span. A step (a burst) makes the window's mean climb for a
    # window after it, towards a load that is already there: no projection while panicking.
    # Agreement over twice the span: a minute or two of noise often moves one way.
    longer = [(t, r) for t, r in memory.arrivals if now - t < 2 * span]
    trending = forecast.agreement(longer, rise) >= TREND_AGREEMENT and abs(rise) * span > band
    if not scaling.project_arrivals or panicking or not trending:
        rise = 0.0
    present = max(arrivals + rise * window / 2, 0.0)
    ahead = present + max(rise, 0.0) * (startup + interval)
    # The short window is noisy: it starts a panic, it does not size an ordinary step.
    held = inputs.held / interval
    up = forecast.replicas_for((short if burst else ahead + held), capacity)
    current = inputs.current
    if burst:  # every sign of one extends the panic, whether or not it needs replicas now
        memory = replace(memory, panic_until=now + window)
    if burst and up > current:
        reason = (
            f"burst: arrivals {short:.1f} req/s over {scaling.panic.window_seconds}s vs "
            f"{arrivals:.1f} over {window}s; {capacity:.1f} req/s per replica{seeded}"
        )
        return Sized(up, reason, memory, True, steady=settled)
    # Until ten windows of arrivals show their noise, wait as long as the settings allow.
    seen = memory.arrivals[-1][0] - memory.arrivals[0][0]
    fresh = seen < noise_seconds(scaling, startup) / 2
    dwell = _dwell(scaling, 1.0 if fresh else band / capacity)
    down = forecast.replicas_for(ahead + held + band, capacity)
    replicas = up if up > current else down if down < current else current
    if rise > 0 and ahead > present and replicas > current:
        reason = (
            f"arrivals {arrivals:.1f} req/s rising {rise * 60:.1f} req/s per minute; pods take "
            f"{startup:.0f}s to start; {capacity:.1f} req/s per replica{seeded}"
        )
    else:
        reason = (
            f"arrivals {arrivals:.1f} req/s over {window}s; {capacity:.1f} req/s per replica"
            f"{seeded}"
        )
    if replicas < current and panicking:
        return Sized(current, reason + "; a burst was seen", memory, False, dwell, settled)
    return Sized(replicas, reason, memory, False, dwell, settled)
