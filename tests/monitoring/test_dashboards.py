"""The generated dashboards and alert rules, without Prometheus: generated the same way twice,
metric names only from kvpilot_common.metric_names, counters and histograms only through rate()
or increase(), every alert documented in docs/runbook.md. (That the committed files are what the
generators make: tests/test_generate.py.)"""

import json
import re

import pytest
import yaml

from kvpilot_common import metric_names as names
from scripts.generators import alerts, dashboards, monitoring
from scripts.generators.paths import FILES, ROOT
from tests.monitoring.metric_kinds import HISTOGRAMS, NAMES

METRIC = re.compile(r"\bkvpilot_[a-z0-9_]+")


def panel_exprs(board: dict) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    return exprs + [a["expr"] for a in board["annotations"]["list"] if a.get("expr")]


def alert_rules() -> list[dict]:
    text = (ROOT / FILES / "alerts.yaml").read_text()
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def all_exprs() -> list[str]:
    boards = dashboards.dashboards().values()
    variables = [
        v["query"] for b in boards for v in b["templating"]["list"] if v["type"] == "query"
    ]
    return (
        [e for b in boards for e in panel_exprs(b)] + variables + [r["expr"] for r in alert_rules()]
    )


def test_generation_is_deterministic():
    assert monitoring.render() == monitoring.render()


def test_metric_names_come_from_metric_names():
    for expr in all_exprs():
        for found in METRIC.findall(expr):
            family = re.sub(r"_(bucket|count|sum)$", "", found)
            assert found in NAMES or family in HISTOGRAMS, f"{found} in {expr}"
    # The generators spell no metric name themselves (module names are not metric names).
    sources = sorted((ROOT / "scripts" / "generators").rglob("*.py"))
    assert ROOT / "scripts" / "generators" / "promql.py" in sources
    spelled = {m for s in sources for m in METRIC.findall(s.read_text())}
    packages = {"kvpilot_common", "kvpilot_server", "kvpilot_operator", "kvpilot_testing"}
    assert spelled - packages == set()


def test_counters_and_histograms_only_through_rate_or_increase():
    boards = dashboards.dashboards().values()
    exprs = [e for b in boards for e in panel_exprs(b)] + [r["expr"] for r in alert_rules()]
    for expr in exprs:
        for found in METRIC.finditer(expr):
            name = found.group()
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            if name.endswith("_total") or family in HISTOGRAMS:
                before = expr[: found.start()]
                assert before.endswith(("rate(", "increase(")), f"{name} raw in {expr}"


# The gateway's series are per ModelDeployment, not per model server pod.
@pytest.mark.parametrize(
    ("file", "pods"), [("model-serving.json", True), ("fleet.json", True), ("gateway.json", False)]
)
def test_dashboard_shape(file, pods):
    board = json.loads((ROOT / FILES / "dashboards" / file).read_text())
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", "namespace", "model"] + ["pod"] * pods
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"] and p["title"] and p["description"]


def test_fleet_shows_scale_events_as_annotations():
    board = dashboards.dashboards()["fleet.json"]
    exprs = [a.get("expr", "") for a in board["annotations"]["list"]]
    assert any(names.OPERATOR_SCALE_EVENTS in e for e in exprs)


def test_gateway_dashboard_shows_every_gateway_metric_and_wakes_from_zero():
    board = dashboards.dashboards()["gateway.json"]
    exprs = " ".join(panel_exprs(board))
    gateway = {v for k, v in vars(names).items() if k.startswith("GATEWAY_")}
    assert gateway and {g for g in gateway if g not in exprs} == set()
    assert 'reason="Demand"' in " ".join(a.get("expr", "") for a in board["annotations"]["list"])


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_alerts_are_complete_and_documented():
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
    documented = set(re.findall(r"^## (Kvpilot\w+)$", runbook, re.M))
    rules = alert_rules()
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == alerts.RUNBOOK_URL and anchor in anchors, url
    assert documented == {r["alert"] for r in rules}
