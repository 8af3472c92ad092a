"""One way for the scripts in benchmarks/ to keep a run: `--record` writes
benchmarks/results/<name>.json, from which scripts/generators/benchmarks.py renders
docs/benchmarks.md (so `scripts/generate.py --check` finds the page stale after a new record).

A record says where and when its figures were measured, because on a shared 2-core machine the
same code moves by a third from run to run: the date, the host (CPU model, the CPU flags that
pick kvpilot's kernels, cores, load average at start and at the end, the process's niceness,
the environment settings that change what runs), the git commit (and whether the tree had
other changes), the command, the headline figures beside the baseline the benchmark measures
in the same run, and the whole JSON it printed.

    run = results.Run.start("shared_prefill")    # first thing in main(): the load at start
    ...
    if args.record:
        run.record(figures, "n prefills (hold-back off)", result)
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from .paths import ROOT

RESULTS = ROOT / "benchmarks" / "results"
# The flags that decide which kernels run and how fast: AVX2 the int8/int4 CPU kernels, VNNI
# their int8 dot products, AVX-512 the wider vectors, AMX or AVX-512 BF16 the bfloat16 matrices
# (oneDNN).
SPEED_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Settings that change which code runs or how many threads it gets, kept when set:
# KVPILOT_CPU_KERNELS=0 measures PyTorch's reference path instead of the compiled kernels.
SPEED_ENV = ("KVPILOT_CPU_KERNELS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
Number = int | float | None


class Figure(TypedDict):
    """One row of docs/benchmarks.md: kvpilot's figure beside the baseline's from the same run
    (None where the baseline has no such figure)."""

    name: str
    unit: str
    kvpilot: Number
    baseline: Number


def figure(name: str, unit: str, kvpilot: Number, baseline: Number = None) -> Figure:
    return {"name": name, "unit": unit, "kvpilot": kvpilot, "baseline": baseline}


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="also write the result to benchmarks/results/<name>.json "
        "(then scripts/generate.py renders it into docs/benchmarks.md)",
    )


def cpu() -> tuple[str, list[str]]:
    """CPU model and the speed-relevant flags, from /proc/cpuinfo (Linux; elsewhere unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", []
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return fields.get("model name", "unknown"), [f for f in SPEED_FLAGS if f in flags]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def host() -> dict[str, Any]:
    model, flags = cpu()
    return {
        "cpu": model,
        "flags": flags,
        "cores": os.cpu_count(),
        "loadavg_at_start": _load(),
        "nice": os.nice(0),
        "env": {name: os.environ[name] for name in SPEED_ENV if name in os.environ},
    }


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> dict[str, Any]:
    """HEAD and whether the measured tree differed from it; the results folder itself does not
    count, or every record after the first would call its tree dirty."""
    changed = _git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    return {"commit": _git("rev-parse", "HEAD") or "unknown", "dirty": bool(changed)}


def _command() -> str:
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


@dataclass
class Run:
    """A benchmark run, begun when its process starts (the load average at start is the one
    that tells whether the machine was busy before the benchmark made it busy)."""

    name: str
    date: str
    host: dict[str, Any]
    command: str
    commit: dict[str, Any] = field(default_factory=commit)

    @classmethod
    def start(cls, name: str) -> "Run":
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(name=name, date=now, host=host(), command=_command())

    def document(self, figures: list[Figure], baseline: str, result: dict) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "date": self.date,
            "host": {**self.host, "loadavg_at_end": _load()},
            **self.commit,
            "command": self.command,
            "baseline": baseline,
            "figures": figures,
            "result": result,
        }

    def record(
        self, figures: list[Figure], baseline: str, result: dict, folder: Path = RESULTS
    ) -> Path:
        """Write benchmarks/results/<name>.json (replacing the last record of this benchmark:
        git keeps the history) and say where on stderr, which carries no JSON."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        document = self.document(figures, baseline, result)
        path.write_text(json.dumps(document, indent=2, default=str) + "\n")
        print(f"recorded {path}", file=sys.stderr)
        return path
