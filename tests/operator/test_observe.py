"""From /metrics texts to observations: parse (real prometheus-client output), p95 from bucket
increases across pods as histogram_quantile computes it, counter resets, pods joining and
leaving."""

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from kvpilot_common import metric_names as names
from kvpilot_common.observe import Window, histogram_quantile, observe, parse


class FakePod:
    """The metrics a kvpilot server exposes, made with prometheus-client itself."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            names.TIME_TO_FIRST_TOKEN,
            "ttft",
            ["model"],
            buckets=names.LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.waiting = Gauge(
            names.REQUESTS_WAITING, "waiting", ["model", "class"], registry=self.registry
        )

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (float("inf"), 100.0)]
    # rank 95 lies in (0.5, 1.0]: 0.5 + 0.5 * (95 - 60) / 40
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.9375)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.05)  # from 0 in the first bucket
    assert histogram_quantile(0.95, [(1.0, 1.0), (float("inf"), 100.0)]) == 1.0  # in +Inf
    assert histogram_quantile(0.95, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_parse_reads_the_interactive_queue_and_the_chosen_histogram():
    pod = FakePod()
    pod.waiting.labels("m", "interactive").set(3)
    pod.waiting.labels("m", "batch").set(7)  # batch work does not count against latency targets
    for value in (0.2, 0.3, 2.0):
        pod.ttft.labels("m").observe(value)
    sample = parse(pod.text(), 10.0, "TimeToFirstToken")
    assert sample.waiting == 3
    buckets = dict(sample.buckets)
    assert buckets[0.25] == 1 and buckets[0.5] == 2 and buckets[float("inf")] == 3


def _observe_two_pods(reset: bool) -> float | None:
    a, b, window = FakePod(), FakePod(), Window(60)
    for pod in (a, b):
        for _ in range(100):
            pod.ttft.labels("m").observe(0.05)  # history from before the window
    window.add("a", parse(a.text(), 0, "TimeToFirstToken"))
    window.add("b", parse(b.text(), 0, "TimeToFirstToken"))
    for _ in range(20):
        a.ttft.labels("m").observe(3.0)  # slow requests inside the window, on pod a
    if reset:
        b = FakePod()  # pod b restarted: its counters start again from zero
    for _ in range(20):
        b.ttft.labels("m").observe(0.05)
    window.add("a", parse(a.text(), 30, "TimeToFirstToken"))
    window.add("b", parse(b.text(), 30, "TimeToFirstToken"))
    observation = observe(window, 30)
    assert observation is not None and observation.finished == 40
    return observation.p95_seconds


def test_p95_comes_from_increases_in_the_window_summed_over_pods():
    # 20 fast + 20 slow in the window: p95 among the slow ones (2.5..5 s bucket).
    assert 2.5 < _observe_two_pods(reset=False) <= 5.0


def test_a_restarted_pod_counts_what_it_counted_since():
    assert 2.5 < _observe_two_pods(reset=True) <= 5.0


def test_pods_joining_and_leaving():
    window, pod = Window(60), FakePod()
    pod.waiting.labels("m", "interactive").set(8)
    window.add("old", parse(pod.text(), 0, "EndToEnd"))
    assert observe(window, 0) is None  # one sample: no rate yet, the autoscaler holds
    window.add("old", parse(pod.text(), 15, "EndToEnd"))
    new = FakePod()
    window.add("new", parse(new.text(), 15, "EndToEnd"))
    observation = observe(window, 15)
    assert observation.pods == 1 and observation.queue_per_replica == 4  # (8 + 0) / 2 pods
    assert observation.p95_seconds is None  # nothing finished
    window.keep_only(["new"])
    assert list(window.pods) == ["new"]


def test_window_keeps_one_baseline_before_its_start():
    window, pod = Window(60), FakePod()
    for t in range(0, 200, 15):
        window.add("p", parse(pod.text(), t, "EndToEnd"))
    times = [s.time for s in window.pods["p"]]
    assert times[0] <= 195 - 60 < times[1] and times[-1] == 195


def test_arrivals_are_what_was_counted_plus_what_the_queue_grew_by():
    window, pod = Window(60), FakePod()
    queue = pod.waiting.labels("m", "interactive")
    window.add("p", parse(pod.text(), 0, "TimeToFirstToken"))
    for t, served, waiting in ((15, 30, 0), (30, 30, 0), (45, 60, 15)):
        for _ in range(served):
            pod.ttft.labels("m").observe(0.1)
        queue.set(waiting)
        window.add("p", parse(pod.text(), t, "TimeToFirstToken"))
    observation = observe(window, 45, recent_seconds=15)
    assert observation is not None
    # 120 first tokens and 15 more waiting over 45 s; over the last 15 s, 60 and 15.
    assert observation.arrivals == pytest.approx(135 / 45)
    assert observation.recent_arrivals == pytest.approx(75 / 15)
    # A queue that drains is work done, not negative arrivals: counted once, by the histogram.
    queue.set(0)
    window.add("p", parse(pod.text(), 60, "TimeToFirstToken"))
    assert observe(window, 60, 15).recent_arrivals == 0.0
