"""The traffic test_queries.py runs while Prometheus scrapes: requests of every kind to a live
`kvpilot serve`, and the operator's and the gateway's metric families updated a few times a
second in this process, as the autoscaler, the reconciler and the gateway update them.

It runs until it has done what the panels need, not for a fixed time: until Prometheus sees a
rate (over the dashboards' window) of every outcome of kvpilot_requests_total and of the
adapter's requests, the rarest kinds; then, the server idle, one more scrape of each target, so
the last counts are in Prometheus."""

import contextlib
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from kvpilot_common import metric_names as names
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_operator import metrics as operator_metrics
from kvpilot_testing.adversary import wait_idle
from kvpilot_testing.corpus import CORPUS
from tests.monitoring.prometheus_server import Prometheus

NAMESPACE, MODEL, POD = "kvpilot-test", "tiny", "tiny-0"
ADAPTER = "tone"  # a LoRA adapter the server carries, for the adapter panels
OPERATOR_NAMESPACE = "kvpilot-system"
CLIENTS = 6  # more than --max-num-seqs 2 + --max-waiting 2: some requests get 429
MIN_TRAFFIC_S = 3.0  # a few scrapes (one a second) of every family, whatever else
MAX_TRAFFIC_S = 60.0  # a bound, not an expectation: it ends within seconds
WINDOW = "30s"  # test_queries.py's $__rate_interval
# What the traffic must have shown Prometheus before it stops: a rate of each outcome that
# _request's kinds end as, and of the adapter's requests (every eighth).
SEEN = (
    f"count(sum by (outcome) (rate({names.REQUESTS}"
    f'{{outcome=~"length|error|abort|rejected"}}[{WINDOW}])) > 0) == 4',
    f"sum(rate({names.LORA_E2E_LATENCY}_count[{WINDOW}])) > 0",
    f"sum(rate({names.LORA_TIME_TO_FIRST_TOKEN}_count[{WINDOW}])) > 0",
)


def run(base: str, prom: Prometheus, gateway: GatewayMetrics) -> None:
    stop = threading.Event()
    workers = [
        threading.Thread(target=_operator, args=(stop, gateway)),
        threading.Thread(target=_traffic, args=(base, stop)),
    ]
    for worker in workers:
        worker.start()
    try:
        started = time.monotonic()
        for expr in SEEN:
            left = started + MAX_TRAFFIC_S - time.monotonic()
            assert prom.wait_for(expr, timeout=max(0.0, left)), f"not seen in time: {expr}"
        time.sleep(max(0.0, started + MIN_TRAFFIC_S - time.monotonic()))
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60.0)
    wait_idle(base)  # aborted streams land at the next engine step
    since = time.time()
    found = prom.wait_for(f"count(timestamp(up == 1) > {since:.3f}) == 3", timeout=30.0)
    assert found, f"targets not scraped since {since}: {prom.query('timestamp(up)')}"


def _request(client: httpx.Client, i: int) -> None:
    """One request of kind i % 4: completed (length), chat with stop strings, timed out
    (408, outcome error), streamed and abandoned after the first chunk (abort)."""
    prompt = CORPUS[:200]  # the same prefix every time: prefix-cache hits
    kind = i % 4
    if kind == 0:  # every other one through the LoRA adapter
        model = ADAPTER if i % 8 == 0 else MODEL
        client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 8})
    elif kind == 1:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "stop": ["e", " "]}
        client.post("/v1/chat/completions", json=body)
    elif kind == 2:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "timeout": 0.001}
        client.post("/v1/completions", json=body)
    else:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as response:
            next(response.iter_lines(), None)


def _traffic(base: str, stop: threading.Event) -> None:
    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=base, timeout=30.0) as client:
            for i in itertools.islice(itertools.count(worker), 1000):
                if stop.is_set():
                    return
                with contextlib.suppress(httpx.HTTPError):
                    _request(client, i)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client_loop, range(CLIENTS)))


def _gateway(metrics: GatewayMetrics, tick: int) -> None:
    """What the gateway's routes and holds record: every outcome, hold and routing reason."""
    labels = (NAMESPACE, MODEL)
    metrics.requests.labels(*labels, "ok").inc()
    for outcome, every in (("upstream_error", 4), ("overloaded", 5), ("starting", 7)):
        if tick % every == 0:
            metrics.requests.labels(*labels, outcome).inc()
    if tick % 3 == 0:
        metrics.unrouted.labels("InvalidRequestError").inc()
    metrics.held.labels(*labels).set(tick % 4)
    metrics.in_flight.labels(*labels).set(tick % 3)
    outcome = "timeout" if tick % 6 == 0 else "ready"
    metrics.hold_seconds.labels(*labels, outcome).observe(0.5 * (1 + tick % 9))
    metrics.upstream_seconds.labels(*labels).observe(0.01 * (1 + tick % 5))
    metrics.routing.labels(*labels, "overflow" if tick % 3 == 0 else "affinity").inc()
    if tick % 2 == 0:
        metrics.retries.labels(*labels).inc()
    if tick % 3 == 1:
        metrics.resumes.labels(*labels, "connection" if tick % 2 else "ended_early").inc()
    if tick % 4 == 1:
        metrics.rate_limited.labels("team-a", "tokens" if tick % 2 else "requests").inc()


def _operator(stop: threading.Event, gateway: GatewayMetrics) -> None:
    """What the autoscaler and the reconciler record, a few times a second (and the gateway)."""
    labels = (NAMESPACE, MODEL)
    for tick in range(int(MAX_TRAFFIC_S * 10) + 10):
        if stop.is_set():
            return
        operator_metrics.desired.labels(*labels).set(2)
        operator_metrics.current.labels(*labels).set(2)
        operator_metrics.ready.labels(*labels).set(1)
        operator_metrics.max_replicas.labels(*labels).set(3)
        operator_metrics.queue.labels(*labels).set(tick % 5)
        operator_metrics.p95.labels(*labels).set(0.1 + 0.01 * (tick % 7))
        operator_metrics.arrivals.labels(*labels).set(5 + tick % 3)
        operator_metrics.capacity.labels(*labels).set(6.5)
        operator_metrics.scrape_failures.labels(*labels).inc(tick % 2)
        operator_metrics.reconcile_seconds.labels(*labels).observe(0.01 * (1 + tick % 7))
        if tick % 3 == 0:
            operator_metrics.reconcile_errors.labels(*labels).inc()
        if tick % 5 == 0:
            operator_metrics.scale_events.labels(*labels, "up", "Arrivals").inc()
        if tick % 5 == 2:  # woken from zero by requests held at the gateway
            operator_metrics.scale_events.labels(*labels, "up", "Demand").inc()
        _gateway(gateway, tick)
        stop.wait(0.1)
