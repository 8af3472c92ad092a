"""`kvpilot bench` against live `kvpilot serve` processes on a tiny model (127.0.0.1): a short
mixed run whose counts add up, cancellations that the server really aborts, 429s counted as
rejections and never as latencies, Ctrl-C that still reports, compare and sweep end to end, and
the structured preset's validity figures."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from PIL import Image

from kvpilot_bench.report import validate
from kvpilot_bench.server_metrics import outcomes

CHAT = {
    "name": "chat",
    "share": 0.5,
    "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
    "output_tokens": {"dist": "uniform", "min": 48, "max": 96},
    # After two streamed tokens of at least 48: always mid-answer, so the server must abort.
    "cancel": {"probability": 0.4, "after_tokens": {"dist": "fixed", "value": 2}},
}
SUMMARIZE = {
    "name": "summarize",
    "share": 0.3,
    "stream": False,
    "prompt_tokens": {"dist": "uniform", "min": 100, "max": 160},
    "output_tokens": {"dist": "uniform", "min": 8, "max": 24},
}
AGENT = {  # the Responses API, streamed, its outputs run to length (ignore_eos)
    "name": "agent",
    "share": 0.2,
    "api": "responses",
    "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
    "output_tokens": {"dist": "uniform", "min": 8, "max": 24},
}
BATCH = {
    "name": "batch",
    "share": 0.2,
    "api": "completions",
    "stream": False,
    "service_tier": "flex",
    "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
    "output_tokens": {"dist": "uniform", "min": 8, "max": 32},
}


@pytest.fixture(scope="module")
def small_server(server_pool, tiny_dir):
    """One sequence at a time and one waiting: a burst is mostly refused with 429."""
    with server_pool.tiny(tiny_dir("llama"), "--max-num-seqs", "1", "--max-waiting", "1") as server:
        yield server.base


def _workload(tmp_path, classes, arrival, duration=4.0, name="w"):
    path = tmp_path / f"{name}.yaml"
    spec = {"name": name, "seed": 5, "duration_s": duration, "arrival": arrival}
    path.write_text(yaml.safe_dump({**spec, "classes": classes}))
    return str(path)


def _bench(*args, timeout=120) -> tuple[subprocess.CompletedProcess, dict]:
    command = [sys.executable, "-m", "kvpilot_common.cli", "bench", "--no-progress", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    out = args[args.index("--json-out") + 1]
    return done, json.loads(Path(out).read_text()) if done.returncode in (0, 130) else {}


def _server_outcomes(base: str) -> dict[str, float]:
    return outcomes(httpx.get(f"{base}/metrics", timeout=10).text)


def _adds_up(summary: dict) -> bool:
    return summary["sent"] == summary["ok"] + summary["cancelled"] + sum(summary["errors"].values())


def test_mixed_run_adds_up_and_cancellations_abort_on_the_server(tiny_server, tmp_path):
    classes = [CHAT, SUMMARIZE, AGENT, BATCH]
    workload = _workload(tmp_path, classes, {"process": "poisson", "rate": 6})
    before = _server_outcomes(tiny_server)
    json_out, png = tmp_path / "r.json", tmp_path / "r.png"
    done, doc = _bench(
        "--url", f"{tiny_server}/v1", "--workload", workload, "--slo-ttft-ms", "2000",
        "--json-out", str(json_out), "--plot-out", str(png),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    (run,) = doc["runs"]
    totals = run["totals"]
    assert run["planned"] == totals["sent"] > 10 and not run["interrupted"]
    assert _adds_up(totals) and all(_adds_up(c) for c in run["classes"].values())
    assert set(run["classes"]) == {"chat", "summarize", "agent", "batch"}
    agent = run["classes"]["agent"]  # read from the Responses API's typed events
    assert agent["ok"] == agent["sent"] > 0 and agent["ttft_ms"]["count"] == agent["ok"]
    assert totals["ok"] > 0 and totals["cancelled"] > 0
    assert run["classes"]["chat"]["cancelled"] == totals["cancelled"]
    assert run["token_counter"] == "server /tokenize" and run["model"] == "tiny"
    assert run["server"] is not None and run["server"]["scrapes"] >= 2
    # Every cancelled stream was aborted by the server, and nothing else was.
    deadline = time.monotonic() + 15
    while True:
        after = _server_outcomes(tiny_server)
        aborted = after.get("abort", 0) - before.get("abort", 0)
        if aborted >= totals["cancelled"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert aborted == totals["cancelled"]
    finished = sum(after.values()) - sum(before.values())
    assert finished == totals["sent"]  # the server saw exactly what the client sent
    # People get the table; the PNG is an image.
    assert "chat TTFT" in done.stdout and "goodput" in done.stdout
    with Image.open(png) as image:
        assert image.format == "PNG"


def test_429s_are_rejections_not_latencies(small_server, tmp_path):
    cls = {**SUMMARIZE, "share": 1, "stream": True, "output_tokens": {"dist": "fixed", "value": 48}}
    burst = {"process": "burst", "size": 12, "every_s": 100}
    workload = _workload(tmp_path, [cls], burst, duration=1.0)
    before = _server_outcomes(small_server)
    done, doc = _bench(
        "--url", small_server, "--workload", workload, "--json-out", str(tmp_path / "r.json")
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    totals = doc["runs"][0]["totals"]
    rejected = totals["errors"]["rejected"]
    assert totals["sent"] == 12 and _adds_up(totals)
    assert rejected == totals["outcomes"]["http_429"] >= 4 and totals["ok"] >= 1
    assert totals["ok"] + rejected == 12
    # Latencies are the completed requests' only.
    assert totals["e2e_ms"]["count"] == totals["ok"] == totals["ttft_ms"]["count"]
    assert totals["goodput"]["eligible"] == 12 and totals["goodput"]["met"] == totals["ok"]
    after = _server_outcomes(small_server)
    assert after.get("rejected", 0) - before.get("rejected", 0) == rejected


def _first_request(base: str, before: dict[str, float], proc: subprocess.Popen) -> None:
    """Until the server has seen a request end since `before` (so the run is under way), or
    the run exited."""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if sum(_server_outcomes(base).values()) > sum(before.values()):
            return
        time.sleep(0.1)


def test_ctrl_c_stops_cleanly_and_still_reports(tiny_server, tmp_path):
    workload = _workload(tmp_path, [CHAT, SUMMARIZE], {"process": "constant", "rate": 4}, 60.0)
    json_out = tmp_path / "r.json"
    command = [sys.executable, "-m", "kvpilot_common.cli", "bench", "--no-progress", "--url",
               tiny_server, "--workload", workload, "--json-out", str(json_out)]  # fmt: skip
    before = _server_outcomes(tiny_server)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Setup (the corpus counted by /tokenize), then Ctrl-C once a request has come back.
        _first_request(tiny_server, before, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "SIGINT: stopping" in stderr and "(interrupted)" in stdout
    doc = json.loads(json_out.read_text())
    validate(doc)
    run = doc["runs"][0]
    assert run["interrupted"] and 0 < run["totals"]["sent"] < run["planned"] == 240
    assert _adds_up(run["totals"]) and run["duration_s"] < 10


def test_compare_two_servers_side_by_side(tiny_server, small_server, tmp_path):
    cls = {
        **CHAT,
        "share": 1,
        "cancel": {"probability": 0.0, "after_ms": {"dist": "fixed", "value": 1}},
    }
    workload = _workload(tmp_path, [cls], {"process": "poisson", "rate": 3}, duration=2.0)
    done, doc = _bench(
        "--url", tiny_server, "--label", "roomy",
        "--compare", small_server, "--compare-label", "small",
        "--workload", workload, "--json-out", str(tmp_path / "c.json"),
        "--plot-out", str(tmp_path / "c.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    assert doc["mode"] == "compare" and [r["label"] for r in doc["runs"]] == ["roomy", "small"]
    first, second = (r["totals"] for r in doc["runs"])
    assert first["sent"] == second["sent"] > 0  # the same plan against each
    assert "small / roomy" in done.stdout and "chat TTFT p95 ms" in done.stdout


def test_sweep_finds_a_rate_and_recommends_targets(small_server, tmp_path):
    cls = {**SUMMARIZE, "share": 1, "output_tokens": {"dist": "fixed", "value": 16}}
    workload = _workload(tmp_path, [cls], {"process": "poisson", "rate": 1})
    done, doc = _bench(
        "--url", small_server, "--workload", workload, "--sweep", "--slo-e2e-ms", "5000",
        "--sweep-start", "1", "--sweep-factor", "8", "--sweep-steps", "3", "--sweep-refine", "0",
        "--sweep-step-duration", "3", "--json-out", str(tmp_path / "s.json"),
        "--plot-out", str(tmp_path / "s.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    sweep = doc["sweep"]
    assert doc["mode"] == "sweep" and len(doc["runs"]) == len(sweep["steps"]) <= 3
    assert sweep["steps"][0]["passed"], sweep  # 1 request/s of 16 tokens: easy
    assert not sweep["steps"][-1]["passed"]  # 8 or 64 requests/s on one seat: refused
    assert sweep["sustainable_rate"] == sweep["steps"][-2]["rate"]
    rec = sweep["recommendation"]
    assert rec["latencyMetric"] == "EndToEnd" and 1 <= rec["targetLatencyP95Milliseconds"] <= 5000
    assert rec["targetQueueDepth"] >= 1
    assert "targetLatencyP95Milliseconds:" in done.stdout and "sustainable:" in done.stdout
    assert "rate 1 req/s: sent " in done.stderr  # one line per step while it runs
    with Image.open(tmp_path / "s.png") as image:
        assert image.format == "PNG"


def test_structured_preset_reports_its_figures(tiny_server, tmp_path):
    """The preset's requests (response_format, tools, tool_choice) against a live server: the
    report has the structured figures and they add up. How many answers are valid depends on
    the server honouring the fields (a random tiny model does not write JSON by itself), so
    the share is not asserted."""
    json_out = tmp_path / "s.json"
    done, doc = _bench(
        "--url", tiny_server, "--workload", "structured", "--requests", "8", "--rate", "8",
        "--json-out", str(json_out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    (run,) = doc["runs"]
    totals, figures = run["totals"], run["totals"]["structured"]
    assert totals["sent"] == figures["sent"] == 8 and _adds_up(totals)
    assert figures["checked"] == totals["ok"]  # every completed answer was checked
    assert figures["valid"] + sum(figures["failures"].values()) == figures["checked"]
    assert sum(v["sent"] for v in figures["variants"].values()) == 8
    for summary in run["classes"].values():
        assert summary["structured"]["sent"] == summary["sent"]
    assert all(r["structured"]["variant"] for r in run["requests"])
    assert "valid share" in done.stdout


def test_tenants_send_at_once_and_each_gets_its_own_report(server_pool, tiny_dir, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-heavy name=heavy\nsk-light name=light\n")
    with server_pool.private_tiny(tiny_dir("llama"), "--api-key-file", str(keys)) as server:
        cls = {**SUMMARIZE, "share": 1}
        workload = _workload(tmp_path, [cls], {"process": "poisson", "rate": 2}, duration=3.0)
        done, doc = _bench(
            "--url", server.base, "--api-key", "sk-light", "--workload", workload,
            "--tenant", "heavy=sk-heavy*4", "--tenant", "light=sk-light",
            "--json-out", str(tmp_path / "t.json"),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    validate(doc)
    assert doc["mode"] == "tenants" and [r["label"] for r in doc["runs"]] == ["heavy", "light"]
    heavy, light = (r["totals"] for r in doc["runs"])
    assert heavy["ok"] == heavy["sent"] and light["ok"] == light["sent"] > 0
    assert heavy["sent"] > 2 * light["sent"]  # four times the rate
    assert "tenant" in done.stdout and "TTFT p95" in done.stdout
