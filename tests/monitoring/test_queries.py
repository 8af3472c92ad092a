"""Every dashboard query and alert expression against a real Prometheus.

Prometheus (1 s scrapes) scrapes a live `kvpilot serve` of the tiny test model under a little
traffic of every kind (completed, stopped, timed out, aborted, refused with 429), and the
operator's metric families served from this process: the real objects of
kvpilot_operator/metrics.py, updated as the autoscaler and reconciler update them. Running the
real operator would need the Kubernetes stand-in and pods it could scrape, and would exercise the
same objects; here each family gets observations within seconds. The operator's target carries a
`namespace` label of its own, as in a cluster, so the scrape must keep the metrics' labels
(honor_labels), as the chart's ServiceMonitor does. The gateway's families likewise: the real
GatewayMetrics of kvpilot_gateway/metrics.py, served from this process and updated as the
gateway's routes and holds update them, scraped with the operator's honor_labels.

Each panel query runs with the dashboard variables set to the test's namespace, model and pod,
and again with every variable at "All": it must parse and return at least one finite sample.
"""

import contextlib
import itertools
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import start_http_server

from kvpilot_common import metric_names as names
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_operator import metrics as operator_metrics
from kvpilot_testing.corpus import CORPUS
from kvpilot_testing.live_server import start_tiny_server, stop_server
from kvpilot_testing.lora import AdapterSpec, build_adapter
from scripts.generators.alerts import alert_groups
from scripts.generators.dashboards import dashboards
from scripts.generators.paths import FILES, ROOT
from tests.monitoring.metric_kinds import HISTOGRAMS, NAMES
from tests.monitoring.prometheus_server import Prometheus, PromQLError, finite

NAMESPACE, MODEL, POD = "kvpilot-test", "tiny", "tiny-0"
ADAPTER = "tone"  # a LoRA adapter the server carries, for the adapter panels
OPERATOR_NAMESPACE = "kvpilot-system"
TRAFFIC_S = 8.0
CLIENTS = 6  # more than --max-num-seqs 2 + --max-waiting 2: some requests get 429
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval stands for here
SPECIFIC = {"namespace": NAMESPACE, "model": MODEL, "pod": POD, "__rate_interval": RATE_INTERVAL}
ALL = {"namespace": ".*", "model": ".*", "pod": ".*", "__rate_interval": RATE_INTERVAL}


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        return values[match.group(1) or match.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


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


def _traffic(base: str, deadline: float) -> None:
    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=base, timeout=30.0) as client:
            for i in itertools.islice(itertools.count(worker), 200):
                if time.monotonic() > deadline:
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


def _operator(deadline: float, gateway: GatewayMetrics) -> None:
    """What the autoscaler and the reconciler record, a few times a second (and the gateway)."""
    labels = (NAMESPACE, MODEL)
    for tick in range(int(TRAFFIC_S * 10) + 10):
        if time.monotonic() > deadline:
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
        time.sleep(0.1)


@pytest.fixture(scope="module")
def prometheus(prometheus_binaries, tiny_dir, tmp_path_factory):
    adapter = tmp_path_factory.mktemp("adapter") / ADAPTER
    build_adapter(tiny_dir("llama"), adapter, AdapterSpec(rank=2, targets=("q_proj", "v_proj")))
    flags = ("--max-num-seqs", "2", "--max-waiting", "2", "--lora-modules", f"{ADAPTER}={adapter}")
    flags += ("--speculative", "ngram")  # the speculative decoding panel's counters
    server, base = start_tiny_server(tiny_dir("llama"), *flags)
    operator_http, operator_thread = start_http_server(0, addr="127.0.0.1")
    gateway = GatewayMetrics()
    gateway_http, gateway_thread = start_http_server(0, addr="127.0.0.1", registry=gateway.registry)
    prom = None
    try:
        engine_target = base.removeprefix("http://")
        operator_target = f"127.0.0.1:{operator_http.server_port}"
        gateway_target = f"127.0.0.1:{gateway_http.server_port}"
        scrape_configs = [
            {
                "job_name": "kvpilot",
                "static_configs": [
                    {"targets": [engine_target], "labels": {"namespace": NAMESPACE, "pod": POD}}
                ],
            },
            {
                "job_name": "kvpilot-operator",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [operator_target],
                        "labels": {"namespace": OPERATOR_NAMESPACE, "pod": "kvpilot-operator-0"},
                    }
                ],
            },
            {
                "job_name": "kvpilot-gateway",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [gateway_target],
                        "labels": {"namespace": OPERATOR_NAMESPACE, "pod": "kvpilot-gateway-0"},
                    }
                ],
            },
        ]
        prom = Prometheus(prometheus_binaries[0], scrape_configs, [ROOT / FILES / "alerts.yaml"])
        up = prom.wait_for("count(up == 1) == 3", timeout=15.0)
        assert up, f"targets not up: {prom.query('up')} {prom.logs()}"
        deadline = time.monotonic() + TRAFFIC_S
        simulation = threading.Thread(target=_operator, args=(deadline, gateway))
        simulation.start()
        _traffic(base, deadline)
        simulation.join(timeout=30.0)
        time.sleep(2.5)  # the last counts scraped
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        operator_http.shutdown()
        operator_http.server_close()
        operator_thread.join(timeout=10.0)
        gateway_http.shutdown()
        gateway_http.server_close()
        gateway_thread.join(timeout=10.0)
        stop_server(server)


def _panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title or annotation name, expr) for every query."""
    found = []
    for file, board in dashboards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                found.append((file, f"{panel['title']} [{target['refId']}]", target["expr"]))
        for annotation in board["annotations"]["list"]:
            if annotation.get("expr"):
                found.append((file, f"annotation {annotation['name']}", annotation["expr"]))
    return found


def test_every_panel_query_returns_data(prometheus):
    queries = _panel_queries()
    assert len(queries) > 30
    failures = []
    for (file, title, expr), (mode, values) in itertools.product(
        queries, [("specific", SPECIFIC), ("all", ALL)]
    ):
        promql = substitute(expr, values)
        try:
            result = prometheus.query(promql)
        except PromQLError as exc:
            failures.append(f"{file} {title} ({mode}): {exc}\n    {promql}")
            continue
        if not finite(result):
            failures.append(f"{file} {title} ({mode}): no finite sample {result}\n    {promql}")
    assert not failures, "\n".join(failures)


def test_every_variable_lists_the_test_targets(prometheus):
    expected = {"namespace": NAMESPACE, "model": MODEL, "pod": POD}
    for file, board in dashboards().items():
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            selector, label = re.fullmatch(
                r"label_values\((.*), (\w+)\)", variable["query"]
            ).groups()
            series = prometheus.api("series", **{"match[]": substitute(selector, SPECIFIC)})
            values = {s.get(label) for s in series}
            assert expected[variable["name"]] in values, (file, variable["query"], values)


def test_counters_and_histograms_as_prometheus_types_them(prometheus):
    """The classification test_dashboards.py relies on agrees with the scraped TYPE lines."""
    metadata = prometheus.api("metadata")
    kvpilot = {name: m[0]["type"] for name, m in metadata.items() if name.startswith("kvpilot_")}
    assert kvpilot, metadata.keys()
    for name, kind in kvpilot.items():
        if kind == "histogram":
            assert name in HISTOGRAMS, name
        elif kind == "counter":  # the family's name, or its sample's
            assert name.removesuffix("_total") + "_total" in NAMES, name
        else:
            assert name not in HISTOGRAMS and not name.endswith("_total"), (name, kind)


def test_every_alert_expression_evaluates(prometheus):
    rules = [r for g in alert_groups()["groups"] for r in g["rules"]]
    for rule in rules:
        prometheus.query(rule["expr"])  # raises on a parse or evaluation error
    # Prometheus evaluates the same file every second: every rule healthy.
    deadline = time.monotonic() + 10.0
    while True:
        loaded = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        if all(r["health"] == "ok" for r in loaded) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
    assert [(r["name"], r["lastError"]) for r in loaded if r["health"] != "ok"] == []
    # The scrape plumbing the fleet alerts rely on: the operator's `namespace` label kept, the
    # operator's target found, engine metrics counted per namespace.
    ours = {
        r["name"]
        for r in loaded
        for a in r["alerts"]
        if a["labels"].get("namespace") in (NAMESPACE, None)
    }
    assert "KvpilotOperatorDown" not in ours
    assert "KvpilotGatewayDown" not in {r["name"] for r in loaded if r["alerts"]}
    assert "KvpilotMetricsAbsent" not in ours
    assert prometheus.query(f'{names.OPERATOR_DESIRED_REPLICAS}{{namespace="{NAMESPACE}"}}')


def test_traffic_reached_every_outcome(prometheus):
    """The traffic is what the panels claim to show: each outcome of kvpilot_requests_total."""
    result = prometheus.query(f"sum by (outcome) ({names.REQUESTS})")
    outcomes = {s["metric"]["outcome"] for s in result}
    assert {"length", "error", "abort", "rejected"} <= outcomes, outcomes
