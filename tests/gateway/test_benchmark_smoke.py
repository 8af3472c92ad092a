"""benchmarks/gateway.py --quick runs end to end on the real control plane: its JSON has every
figure the docs quote, the paired latencies are real, and every held stream was released."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_gateway_benchmark_runs_and_releases_every_held_stream(tmp_path):
    out = tmp_path / "gateway.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gateway.py"), "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
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
