"""The suite's own plumbing under pytest-xdist, as scripts/test.sh runs it: each worker gives
torch its share of the cores, and the durations record is the controller's, with every test."""

import json
import os
import subprocess
import sys
import textwrap

PROBE = """
import os

import pytest


@pytest.mark.parametrize("case", range(4))
def test_probe(case):
    assert os.environ.get("OMP_NUM_THREADS") == os.environ["EXPECTED_THREADS"]
"""


def test_workers_share_the_cores_and_the_record_holds_every_test(tmp_path):
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    record = tmp_path / "durations.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= {"KVPILOT_DURATIONS": str(record)}
    env["EXPECTED_THREADS"] = str(max(1, (os.cpu_count() or 1) // 2))
    plugins = ["-p", "kvpilot_testing.workers", "-p", "kvpilot_testing.durations"]
    argv = [sys.executable, "-m", "pytest", *plugins, "-n", "2", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*argv, "-q", "test_probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = json.loads(record.read_text())
    assert len(written["tests"]) == 4 and written["exit_status"] == 0, written
    assert {t["outcome"] for t in written["tests"]} == {"passed"}
