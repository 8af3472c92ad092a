"""A simulated service for the autoscaler, in seconds of CPU: replicas with a fixed capacity and
a start-up delay, fed a trace of arrival rates, scaled by the real decide() every interval.

Each replica is an M/M/1 queue (service rate CAPACITY): at utilisation rho the p95 response time
is ln(20) x service time / (1 - rho) and the mean queue rho^2 / (1 - rho); past rho = 1 a backlog
builds up and drains at the spare capacity. The oracle runs, each second, the fewest replicas
whose p95 meets the target for that second's arrival rate, with no start-up delay.

What the controller is told is what the real one measures: over its window, the arrivals (the
pods' finished requests plus their queues' growth, which in this fluid model is the trace's
mean), the mean queue per replica and the p95; over the last interval, the arrivals again (the
short window); and the start-up time the pods took (the real operator reads it from each pod's
start and Ready condition).
"""

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from kvpilot_operator import crd
from kvpilot_operator.decide import Inputs, decide
from kvpilot_operator.forecast import Memory
from kvpilot_operator.spec import Autoscaling, Spec

CAPACITY = 10.0  # requests per second one replica serves
P95_FACTOR = math.log(20) / CAPACITY  # M/M/1: p95 response = ln(20) / (mu - lambda)
STARTUP_S = 60  # a new replica loads its model this long before serving
DURATION_S, WARMUP_S, WINDOW_S = 4 * 3600, 1800, 60
TARGET_P95_MS = 1000
MAX_RHO = 1 - P95_FACTOR / (TARGET_P95_MS / 1000)  # the utilisation at which p95 hits target


def scaling(**fields: object) -> Autoscaling:
    """spec.autoscaling (enabled) with `fields` (CRD spelling) set, the CRD's defaults for the
    rest: what the operator would read."""
    spec = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "autoscaling": {"enabled": True, **fields},
    }
    return Spec.from_defaulted(crd.with_defaults({"spec": spec})).autoscaling


SETTINGS = {
    "minReplicas": 1,
    "maxReplicas": 20,
    "targetQueueDepth": 4,
    "targetLatencyP95Milliseconds": TARGET_P95_MS,
    "windowSeconds": WINDOW_S,
    "intervalSeconds": 15,
    "scaleDown": {"stabilizationSeconds": 300, "maxStepReplicas": 2},
}
SCALING = scaling(**SETTINGS)

Trace = Callable[[int], float]  # second -> requests per second


def diurnal(t: int) -> float:
    """A day compressed into two hours, plus two bursts (3 and 2 minutes)."""
    rate = 45 + 35 * math.sin(2 * math.pi * t / 7200)
    if 3000 <= t < 3180 or 9000 <= t < 9120:
        rate += 40
    return rate


def ramp_with_ripple(t: int) -> float:
    """A steep morning ramp, 10 -> 90 requests/s in 20 minutes, and a ripple of +-3 every 10
    minutes throughout (what a few tenants' cron jobs look like)."""
    start, minutes = 2400, 20
    rise = min(max(t - start, 0) / (minutes * 60), 1.0)
    return 10 + 80 * rise + 3 * math.sin(2 * math.pi * t / 600)


def sawtooth(t: int) -> float:
    """A slow rise, 20 -> 80 requests/s over an hour, then a sudden drop, again and again."""
    return 20 + 60 * ((t % 3600) / 3600)


def bursts(t: int) -> float:
    """A plateau of 40 requests/s and bursts of +20 lasting 30 s, 2, 5 and 10 minutes."""
    rate = 40.0
    for start, length in ((2400, 30), (5400, 120), (8400, 300), (11400, 600)):
        if start <= t < start + length:
            rate += 20
    return rate


_NOISE = random.Random(20261203)
_PLATEAU = [_NOISE.gauss(0, 1) for _ in range(DURATION_S // 10 + 1)]


def noisy_plateau(t: int) -> float:
    """50 requests/s, its rate jumping every 10 s (sigma 3: sessions starting and ending; the
    M/M/1 model already holds the per-request randomness) and wandering +-2 over minutes."""
    wander = 2 * math.sin(2 * math.pi * t / 1700) * math.sin(2 * math.pi * t / 530)
    return max(0.0, 50 + wander + 3 * _PLATEAU[t // 10])


def slow_decline(t: int) -> float:
    """90 requests/s falling steadily to 10 over the four hours (an evening)."""
    return 90 - 80 * t / DURATION_S


TRACES: dict[str, Trace] = {
    "diurnal with bursts": diurnal,
    "steep ramp with ripple": ramp_with_ripple,
    "sawtooth": sawtooth,
    "bursts of 30s to 10min": bursts,
    "noisy plateau": noisy_plateau,
    "slow decline": slow_decline,
}


def p95(latencies: list[tuple[float, float]]) -> float:
    """The 95th percentile of (latency, weight) pairs."""
    ordered, total, seen = sorted(latencies), sum(w for _, w in latencies), 0.0
    for latency, weight in ordered:
        seen += weight
        if seen >= 0.95 * total:
            return latency
    return ordered[-1][0]


@dataclass
class Replicas:
    desired: int
    ready: int
    starting: list[int]  # times at which starting replicas become ready

    def scale(self, to: int, t: int) -> None:
        if to > self.desired:
            self.starting += [t + STARTUP_S] * (to - self.desired)
        elif to < self.desired:
            drop = self.desired - to
            cancelled = min(drop, len(self.starting))  # stop loading ones first
            self.starting = self.starting[cancelled:]
            self.ready -= drop - cancelled
        self.desired = to


def simulate(trace: Trace, settings: Autoscaling = SCALING, demand: bool = True) -> dict:
    """The figures of one run. `demand` False: the controller is told no arrivals, so it scales
    on latency and queue ratios alone (as it did before sizing from demand, and as the HPA
    does)."""
    first = math.ceil(trace(0) / (CAPACITY * MAX_RHO))
    pods = Replicas(first, first, [])
    queue, history, memory = 0.0, [], Memory()
    replica_seconds = oracle_seconds = windows_ok = windows = 0
    window: list[tuple[float, float, float]] = []  # (latency, arrivals, queue per replica)
    moves: list[int] = []
    missed: list[int] = []  # ends of windows over target
    interval = settings.interval_seconds
    short = max(settings.panic.window_seconds, interval)
    for t in range(DURATION_S):
        pods.ready += sum(1 for s in pods.starting if s == t)
        pods.starting = [s for s in pods.starting if s > t]
        rate = trace(t)
        capacity = pods.ready * CAPACITY
        rho = rate / max(capacity, 1e-9)
        queue = max(0.0, queue + rate - capacity)  # backlog beyond what the replicas absorb
        steady = min(rho, 0.99)
        latency = P95_FACTOR / (1 - steady) + queue / max(capacity, 1e-9)
        waiting = pods.ready * steady**2 / (1 - steady) + queue
        window.append((latency, rate, waiting / max(pods.ready, 1)))
        window = window[-WINDOW_S:]
        if t >= WARMUP_S:
            replica_seconds += pods.ready + len(pods.starting)
            oracle_seconds += math.ceil(rate / (CAPACITY * MAX_RHO))
        if t % WINDOW_S == WINDOW_S - 1 and t >= WARMUP_S:
            windows += 1
            ok = p95([(lat, w) for lat, w, _ in window]) * 1000 <= TARGET_P95_MS
            windows_ok += ok
            missed += [] if ok else [t]
        if t % interval == 0 and t > 0:
            observed = Inputs(
                current=pods.desired,
                starting=len(pods.starting),
                pods_scraped=pods.ready,
                scrape_failures=0,
                queue_per_replica=sum(q for _, _, q in window) / len(window),
                p95_ms=p95([(lat, w) for lat, w, _ in window]) * 1000,
                finished=sum(w for _, w, _ in window),
                arrivals=sum(w for _, w, _ in window) / len(window) if demand else None,
                recent_arrivals=sum(w for _, w, _ in window[-short:]) / short if demand else None,
                startup_seconds=STARTUP_S,
            )
            decision = decide(observed, settings, history, float(t), memory)
            history, memory = decision.history, decision.memory
            if decision.replicas != pods.desired and t >= WARMUP_S:
                moves.append(1 if decision.replicas > pods.desired else -1)
            pods.scale(decision.replicas, t)
    return {
        "windows_within_target": round(windows_ok / windows, 4),
        "replica_seconds_vs_oracle": round(replica_seconds / oracle_seconds, 3),
        "direction_reversals": sum(1 for a, b in itertools.pairwise(moves) if a != b),
        "scale_events": len(moves),
        "windows_over_target_at_s": missed,
        "capacity_learned": None if memory.capacity is None else round(memory.capacity, 2),
    }
