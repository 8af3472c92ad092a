"""Reports offline: the JSON validates against the shipped schema (and the schema refuses what it
should), the PNGs are images, the table and the side-by-side comparison read right, and the
sweep finds the rate that holds and turns the server's view into autoscaling targets."""

import asyncio
import json
import math

import jsonschema
import pytest
from PIL import Image

from kvpilot_bench import report as reporting
from kvpilot_bench.client import Endpoint, Record
from kvpilot_bench.compare import side_by_side
from kvpilot_bench.plot import plot_runs, plot_sweep
from kvpilot_bench.runner import RunResult
from kvpilot_bench.stats import Slo
from kvpilot_bench.sweep import (
    SweepOptions,
    autoscaling_yaml,
    first_rates,
    recommend,
    sweep,
)
from kvpilot_bench.workload import load

SLO = Slo(ttft_ms=300, e2e_ms=3000)
SERVER = {
    "scrapes": 10,
    "queue_per_replica": 2.6,
    "p95_ttft_ms": 212.4,
    "p95_e2e_ms": 1800.0,
    "outcomes": {"abort": 1, "length": 5},
}


def _result(label="A", scale=1.0, server=SERVER) -> RunResult:
    workload = load("mixed")
    records = []
    for i in range(30):
        cls = workload.classes[i % 3]
        outcome = ["ok", "ok", "ok", "cancelled", "http_429"][i % 5]
        streamed = cls.stream and outcome != "http_429"
        records.append(
            Record(
                index=i,
                cls=cls.name,
                stream=cls.stream,
                sent_at=i * 0.3,
                lag=0.001,
                outcome=outcome,
                status=429 if outcome == "http_429" else 200,
                ttft=scale * (0.05 + 0.01 * i) if streamed else None,
                e2e=scale * (0.5 + 0.05 * i),
                itl=[scale * 0.02] * 5 if streamed else [],
                tokens_in=100,
                tokens_out=6,
            )
        )
    return RunResult(
        endpoint=Endpoint("http://127.0.0.1:1", "m", None, label),
        workload=workload,
        records=records,
        planned=30,
        started_at="2026-12-01T00:00:00+00:00",
        duration_s=10.0,
        interrupted=False,
        token_counter="server /tokenize",
        clamped=0,
        server=server,
    )


def test_report_validates_against_the_schema(tmp_path):
    result = _result()
    rep = reporting.run_report(result, SLO)
    doc = reporting.document("run", [rep])
    reporting.validate(doc)
    json.loads(json.dumps(doc))  # plain JSON
    totals = rep["totals"]
    assert totals["sent"] == totals["ok"] + totals["cancelled"] + sum(totals["errors"].values())
    assert totals["errors"]["rejected"] == 6
    assert set(rep["classes"]) == {"chat", "summarize", "batch"}
    # Every request is in the report as measured; errors carry no latency of their own kind.
    assert [r["index"] for r in rep["requests"]] == list(range(30))
    rejected = [r for r in rep["requests"] if r["outcome"] == "http_429"]
    assert len(rejected) == 6 and all(r["ttft_ms"] is None for r in rejected)
    # The schema is a contract: it refuses a report that breaks it.
    broken = json.loads(json.dumps(doc))
    broken["runs"][0]["totals"]["outcomes"]["weird"] = 1
    with pytest.raises(jsonschema.ValidationError):
        reporting.validate(broken)
    broken = json.loads(json.dumps(doc))
    del broken["runs"][0]["classes"]["chat"]["ttft_ms"]
    with pytest.raises(jsonschema.ValidationError):
        reporting.validate(broken)
    # And other servers (no kvpilot /metrics) report server: null.
    reporting.validate(reporting.document("run", [reporting.run_report(_result(server=None), SLO)]))


def test_table_shows_counts_latencies_and_the_server_view():
    text = reporting.table(reporting.run_report(_result(), SLO))
    lines = text.splitlines()
    assert lines[0].startswith("mixed against http://127.0.0.1:1 (m): 10.0 s, 30 of 30 planned")
    assert "TTFT <= 300 ms, E2E <= 3000 ms" in lines[1]
    assert any(line.startswith("all ") and "rejected 6" in line for line in lines)
    assert any(line.startswith("chat TTFT") for line in lines)
    assert not any(line.startswith("summarize TTFT") for line in lines)  # not streamed
    assert "queue 2.60/replica, p95 TTFT 212 ms" in text


def test_plots_are_pngs(tmp_path):
    results = [_result("A"), _result("B", scale=2.0)]
    reports = [reporting.run_report(r, SLO) for r in results]
    for path, draw in (
        (tmp_path / "run.png", lambda p: plot_runs(results[:1], reports[:1], str(p))),
        (tmp_path / "compare.png", lambda p: plot_runs(results, reports, str(p))),
    ):
        draw(path)
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 500 and image.size[1] > 300
        assert path.stat().st_size < 200_000


def test_compare_side_by_side():
    reports = [reporting.run_report(r, SLO) for r in (_result("A"), _result("B", scale=2.0))]
    reporting.validate(reporting.document("compare", reports))
    text = side_by_side(reports)
    header, *rows = text.splitlines()
    assert header.split() == ["A", "B", "B", "/", "A"]
    ttft = next(r for r in rows if r.startswith("chat TTFT p50 ms"))
    assert ttft.split()[-1] == "2.00x"  # B's latencies are twice A's
    assert any(r.startswith("all goodput") for r in rows)


def test_sweep_finds_the_highest_rate_that_holds(tmp_path):
    capacity = 3.0  # the fake server keeps the SLO up to this rate

    async def run_at(rate):
        result = _result(f"{rate}", scale=1.0 if rate <= capacity else 10.0)
        if rate > capacity:
            result.records = [r for r in result.records if r.outcome != "http_429"]
        else:
            for r in result.records:
                if r.outcome == "http_429":
                    r.outcome, r.ttft, r.status = "ok", 0.05, 200
        return result, reporting.run_report(result, SLO)

    options = SweepOptions(start=1.0, factor=2.0, max_steps=5, refine=2, goodput_target=0.9)
    assert first_rates(options) == [1.0, 2.0, 4.0, 8.0, 16.0]
    steps, section = asyncio.run(sweep(run_at, options, SLO))
    assert [s.rate for s in steps] == [1.0, 2.0, 4.0, 2.8284, 3.3636]
    assert [s.passed for s in steps] == [True, True, False, True, False]
    assert section["sustainable_rate"] == 2.8284
    rec = section["recommendation"]
    assert rec == {
        "targetQueueDepth": 2,  # 2.6 waiting at the sustainable rate, rounded down
        "targetLatencyP95Milliseconds": 213,  # the server's p95 TTFT there, rounded up
        "latencyMetric": "TimeToFirstToken",
        "replicaCapacityRequestsPerMinute": 169,  # the sustainable rate (2.8284/s): the seed
        "notes": [],
    }
    reports = [s.report for s in steps]
    reporting.validate(reporting.document("sweep", reports, section))
    plot_sweep(section, reports, str(tmp_path / "sweep.png"))
    with Image.open(tmp_path / "sweep.png") as image:
        assert image.format == "PNG"


def test_recommendations_in_the_autoscalers_units():
    rep = reporting.run_report(_result(), SLO)
    rep["server"] = {**SERVER, "queue_per_replica": 0.3, "p95_ttft_ms": 450.0}
    rec = recommend(rep, SLO)
    assert rec["targetQueueDepth"] == 1 and rec["targetLatencyP95Milliseconds"] == 300
    assert len(rec["notes"]) == 2  # the queue is below 1; the p95 is above the SLO
    rec = recommend(rep, Slo(e2e_ms=5000))
    assert rec["latencyMetric"] == "EndToEnd" and rec["targetLatencyP95Milliseconds"] == 1800
    rep["server"] = None  # not a kvpilot server: the client's p95, no queue target
    client_p95 = rep["totals"]["ttft_ms"]["p95"]
    rec = recommend(rep, SLO)
    assert rec["targetQueueDepth"] is None
    assert rec["targetLatencyP95Milliseconds"] == math.ceil(client_p95) <= 300
    rec = recommend(rep, Slo(ttft_ms=250))
    assert client_p95 > 250 and rec["targetLatencyP95Milliseconds"] == 250  # capped at the SLO
    assert autoscaling_yaml(rec) == (
        "autoscaling:\n  enabled: true\n  targetLatencyP95Milliseconds: 250\n"
        "  latencyMetric: TimeToFirstToken"
    )
    # The sustainable rate of one replica is the capacity the autoscaler starts from.
    rec = recommend(rep, Slo(ttft_ms=250), rate=2.8284)
    assert rec["replicaCapacityRequestsPerMinute"] == 169
    assert autoscaling_yaml(rec).endswith("\n  replicaCapacityRequestsPerMinute: 169")
