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

import itertools
import re
import time
from collections.abc import Iterator

import pytest
from prometheus_client import start_http_server

from kvpilot_common import metric_names as names
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_testing.lora import AdapterSpec, build_adapter
from scripts.generators.alerts import alert_groups
from scripts.generators.dashboards import dashboards
from scripts.generators.paths import FILES, ROOT
from tests.monitoring import traffic
from tests.monitoring.metric_kinds import HISTOGRAMS, NAMES
from tests.monitoring.prometheus_server import Prometheus, PromQLError, finite
from tests.monitoring.traffic import ADAPTER, MODEL, NAMESPACE, OPERATOR_NAMESPACE, POD

RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval stands for here
SPECIFIC = {"namespace": NAMESPACE, "model": MODEL, "pod": POD, "__rate_interval": RATE_INTERVAL}
ALL = {"namespace": ".*", "model": ".*", "pod": ".*", "__rate_interval": RATE_INTERVAL}


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        return values[match.group(1) or match.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


@pytest.fixture(scope="module")
def prometheus(prometheus_binaries, server_pool, tiny_dir, tmp_path_factory):
    adapter = tmp_path_factory.mktemp("adapter") / ADAPTER
    build_adapter(tiny_dir("llama"), adapter, AdapterSpec(rank=2, targets=("q_proj", "v_proj")))
    flags = ("--max-num-seqs", "2", "--max-waiting", "2", "--lora-modules", f"{ADAPTER}={adapter}")
    flags += ("--speculative", "ngram")  # the speculative decoding panel's counters
    # A server of its own: its adapter is this module's, and its counters are read whole.
    with server_pool.private_tiny(tiny_dir("llama"), *flags) as server:
        yield from _watched(prometheus_binaries[0], server.base)


def _watched(binary: str, base: str) -> Iterator[Prometheus]:
    """Prometheus scraping the server at `base`, the operator's and the gateway's families, once
    the traffic has run."""
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
        prom = Prometheus(binary, scrape_configs, [ROOT / FILES / "alerts.yaml"])
        up = prom.wait_for("count(up == 1) == 3", timeout=15.0)
        assert up, f"targets not up: {prom.query('up')} {prom.logs()}"
        traffic.run(base, prom, gateway)
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
