"""benchmarks/gateway.py --quick runs end to end on the real control plane: its JSON has every
figure the docs quote, the paired latencies are real, and every held stream was released."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The benchmark brings up a control plane of its own, not the session's `kube`: the tiers
# cannot see it from the fixtures, so it is marked here.
pytestmark = pytest.mark.k8s

ROOT = Path(__file__).parents[2]


def test_the_gateway_benchmark_runs_and_releases_every_held_stream(tmp_path):
    out = tmp_path / "gateway.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "gateway.py"),
        "--quick",
        "--out",
        str(out),
    ]
    bench = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = bench.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        # SIGINT, not run()'s SIGKILL: the benchmark's own cleanup stops what it started (the
        # control plane, the node's servers, the gateway) instead of leaving them running.
        bench.send_signal(signal.SIGINT)
        stdout, stderr = bench.communicate(timeout=60)
        raise AssertionError(f"the benchmark ran past 300 s: {stderr[-3000:]}") from None
    assert bench.returncode == 0, stderr[-3000:]
    report = json.loads(stdout)
    assert report == json.loads(out.read_text())
    assert {"machine", "params", "latency", "target", "held", "rss_growth_on_repeat_kib"} <= set(
        report
    )
    assert set(report["latency"]) == {
        "completion",
        "stream_first_byte",
        "proxy_only_400",
        "models_not_proxied",
    }
    for kind in report["latency"].values():
        assert kind["direct_ms"]["p50"] > 0 and kind["gateway_ms"]["p50"] > 0
        assert set(kind["added_ms"]) == {"p50", "p99"}
    assert isinstance(report["target"]["met"], bool)
    assert len(report["held"]) == 2  # the level, then again
    for level in report["held"]:
        assert level["held"] == 20 and level["still_held_after_1s"] == 20
        assert level["answers_before_leaving"] == {}  # nothing woke the model
        assert level["released_as_client_closed"] == 20
        assert level["held_after_release"] == 0
        assert isinstance(level["bytes_per_held"], int)  # 20 may fit in memory already held
