"""From scraped /metrics texts to what the autoscaler decides on. Pure: no I/O, no clock.

Each pod's samples are kept for the window (plus the one just before it, the baseline). Over the
window: the average interactive queue per replica, the p95 of a latency histogram from the
bucket increases summed over pods, interpolated within buckets as Prometheus'
histogram_quantile does, and the arrivals per second: what the histogram counted plus what the
queue grew by (a request that arrived and still waits is demand too), over the window and over
a short recent span (the autoscaler's panic window). A pod whose counters went down restarted:
its increase is what it has counted since. Pods that come and go simply contribute while they
have samples.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names

LATENCY_METRICS = {
    "TimeToFirstToken": names.TIME_TO_FIRST_TOKEN,
    "EndToEnd": names.E2E_LATENCY,
}


@dataclass(frozen=True)
class Sample:
    time: float
    waiting: float  # interactive requests waiting
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), +Inf last


def parse(text: str, time: float, latency_metric: str) -> Sample:
    """One scrape of a kvpilot server's /metrics."""
    histogram, waiting = LATENCY_METRICS[latency_metric], 0.0
    buckets: dict[float, float] = {}  # le -> cumulative count, summed over the pod's labels
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (
                s.name == names.REQUESTS_WAITING
                and s.labels.get("class") == names.CLASS_INTERACTIVE
            ):
                waiting += s.value
            elif s.name == f"{histogram}_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return Sample(time, waiting, tuple(sorted(buckets.items())))


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' rule: find the bucket holding the q-th observation and interpolate linearly
    inside it (from 0 for the first bucket); in the +Inf bucket, the highest finite bound."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def _increase(first: Sample, last: Sample) -> dict[float, float]:
    before, after = dict(first.buckets), dict(last.buckets)
    if any(after.get(le, 0.0) < count for le, count in before.items()):  # the pod restarted
        return after
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


@dataclass
class Window:
    """Samples per pod over the last `seconds`, plus each pod's baseline just before them."""

    seconds: float
    pods: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, pod: str, sample: Sample) -> None:
        samples = self.pods.setdefault(pod, [])
        samples.append(sample)
        start = sample.time - self.seconds
        while len(samples) > 1 and samples[1].time <= start:
            samples.pop(0)  # keep one sample at or before the window's start as the baseline

    def keep_only(self, pods: Iterable[str]) -> None:
        """Forget pods that are gone."""
        alive = set(pods)
        for pod in [p for p in self.pods if p not in alive]:
            del self.pods[pod]


@dataclass(frozen=True)
class Observation:
    pods: int  # pods with at least two samples (a rate needs two)
    queue_per_replica: float
    p95_seconds: float | None  # None: no request finished in the window
    finished: float  # requests finished in the window, all pods
    arrivals: float = 0.0  # requests arriving per second over the window, all pods
    recent_arrivals: float = 0.0  # the same over the recent span


def _arrival_rate(first: Sample, last: Sample) -> float:
    """Requests per second that reached the pod between two samples: counted by the histogram
    (its +Inf bucket) or still waiting in a queue that grew."""
    if last.time <= first.time:
        return 0.0
    counted = max(_increase(first, last).values(), default=0.0)
    return max(counted + last.waiting - first.waiting, 0.0) / (last.time - first.time)


def _since(samples: list[Sample], start: float) -> Sample:
    """The newest sample at or before `start` (the oldest kept if none is that old), never the
    last one itself while there are two."""
    earlier = [s for s in samples[:-1] if s.time <= start]
    return earlier[-1] if earlier else samples[0]


def observe(window: Window, now: float, recent_seconds: float = 0.0) -> Observation | None:
    """None when no pod has two samples yet: the autoscaler then holds. `recent_seconds`: the
    span of recent_arrivals (at least the last two samples')."""
    increases: dict[float, float] = {}
    queues, pods, arrivals, recent_arrivals = [], 0, 0.0, 0.0
    for samples in window.pods.values():
        recent = [s for s in samples if s.time >= now - window.seconds] or samples[-1:]
        queues.append(sum(s.waiting for s in recent) / len(recent))
        if len(samples) < 2:
            continue
        pods += 1
        for le, count in _increase(samples[0], samples[-1]).items():
            increases[le] = increases.get(le, 0.0) + count
        arrivals += _arrival_rate(samples[0], samples[-1])
        recent_arrivals += _arrival_rate(_since(samples, now - recent_seconds), samples[-1])
    if pods == 0:
        return None
    finished = max(increases.values(), default=0.0)
    p95 = histogram_quantile(0.95, increases.items()) if finished > 0 else None
    return Observation(pods, sum(queues) / len(queues), p95, finished, arrivals, recent_arrivals)
