"""benchmarks/gpu_check.py rehearsed on the CPU with small shapes, so that only the run on a GPU
is left: every stage passes, writes its JSON, and measures what it says it does."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot_testing.paths import ROOT


@pytest.mark.slow
def test_the_gpu_check_passes_on_the_cpu(tmp_path: Path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--out",
            str(out),
            "--budget-scale",
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    stages = {
        p.name.split("_", 1)[1].removesuffix(".json"): json.loads(p.read_text())
        for p in sorted(out.glob("0*.json"))
    }
    assert list(stages) == [
        "preamble",
        "ops",
        "bundled",
        "equivalence",
        "quantizations",
        "decode",
        "throughput",
    ]
    assert json.loads((out / "summary.json").read_text()) == {
        name: {"ok": True, "seconds": stage["seconds"]} for name, stage in stages.items()
    }
    ops = stages["ops"]
    assert ops["fp8_linear"]["skipped"]  # no fp8 on a CPU: said, not hidden
    errors = ops["paged_attention"]["relative_error"]
    assert len(errors) == 12 and all(isinstance(e, float) for e in errors.values())
    assert "MATH" in ops["sdpa_backends"]["decode_group"]
    assert "Paris" in stages["bundled"]["text"]
    llama = stages["equivalence"]["llama"]["float32"]
    assert llama["identical_sequences"] == "8/8" and llama["chunked_prefill_identical"]
    assert stages["quantizations"]["int8"]["agreement_with_none"] > 0.9
    decode = stages["decode"]["context_128"]
    assert decode["ms_per_token"] > 0 and decode["bound_ms"] > 0
    assert stages["throughput"]["prompts_8"]["hf_tok_s"] > 0


def test_a_stage_that_fails_or_overruns_is_reported_and_the_next_one_runs(tmp_path: Path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def broken() -> dict:
        raise RuntimeError("no kernel image is available")

    def slow() -> dict:
        import time

        time.sleep(5)
        return {"ok": True}

    failed = gpu_check.run_stage("ops", 10, broken, tmp_path, 1)
    overran = gpu_check.run_stage("decode", 1, slow, tmp_path, 2)
    fine = gpu_check.run_stage("throughput", 10, lambda: {"ok": True, "x": 1}, tmp_path, 3)
    assert not failed["ok"] and "no kernel image" in failed["error"] and failed["trace"]
    assert not overran["ok"] and "StageTimeout" in overran["error"] and overran["seconds"] < 3
    assert fine == {"stage": "throughput", "seconds": fine["seconds"], "ok": True, "x": 1}
    assert json.loads((tmp_path / "01_ops.json").read_text())["ok"] is False
