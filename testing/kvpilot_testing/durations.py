"""Every test's time on record: a pytest plugin (tests/conftest.py loads it) that writes, at
the end of every run, each test's setup, call and teardown seconds to a JSON file, slowest
first, with the machine it ran on. Where the suite's minutes go is then a file to read, not a
rerun with --durations; scripts/test.sh names one file per step (with the steps' own times
beside them), a bare pytest run writes test-results/durations.json.
"""

import json
import os
import platform
import time
from pathlib import Path

import pytest

ENV = "KVPILOT_DURATIONS"  # where to write; unset: DEFAULT
DEFAULT = Path("test-results") / "durations.json"
PHASES = ("setup", "call", "teardown")


def cpu_model() -> str:
    """The CPU's name and the vector extensions that choose kernels (Linux; else the arch)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    fields = dict(
        line.split(":", 1) for line in info.splitlines()[:40] if ":" in line and line.strip()
    )
    name = fields.get("model name\t", fields.get("model name", "")).strip()
    flags = set(fields.get("flags\t\t", fields.get("flags", "")).split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
    return f"{name} ({' '.join(f for f in wanted if f in flags) or 'no avx2'})"


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path, self.started = path, time.time()
        self.tests: dict[str, dict] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(report.nodeid, {"outcome": "passed"})
        entry[report.when] = round(report.duration, 3)
        if report.outcome != "passed" and entry["outcome"] == "passed":
            entry["outcome"] = report.outcome

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        tests = [
            {"test": nodeid, **entry, "total": round(sum(entry.get(p, 0.0) for p in PHASES), 3)}
            for nodeid, entry in self.tests.items()
        ]
        tests.sort(key=lambda t: -t["total"])
        record = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_s": round(time.time() - self.started, 1),
            "exit_status": int(exitstatus),
            "args": list(session.config.invocation_params.args),
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load": os.getloadavg()},
            "tests_s": round(sum(t["total"] for t in tests), 1),
            "tests": tests,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its reports reach the controller's
        return
    path = Path(os.environ.get(ENV) or config.rootpath / DEFAULT)
    config.pluginmanager.register(Recorder(path), "kvpilot-durations")
