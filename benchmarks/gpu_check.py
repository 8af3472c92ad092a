"""The first run of kvpilot's CUDA path, as one script: each stage's JSON is written as soon as
the stage ends (a stage killed by its time budget still leaves the ones before), the most likely
failures first. Exit status 0 when every stage passed.

Stages: preamble (versions, compute capability, that the engine's device is really CUDA: `auto`
falls back to the CPU when the wheel's CUDA is newer than the driver); ops without a model (fp8
products, paged attention against a float32 reference, SDPA backends, varlen flash attention
over a block table); the bundled model's chat answer; Hugging Face equivalence on the tiny
checkpoints of several families (float32 token for token, through the prefix cache and chunked
prefill); each quantization; batch-1 decode of a Llama-3-8B-shaped model against the bandwidth
bound; throughput against Hugging Face `generate`. `--device cpu` runs it all with small shapes,
so that only the device run is left for a machine with a GPU.

A GPU machine may have its own torch and no network. Prepare a folder here that travels with the
tree (git-ignored), then run there with the checkout's packages on the path:

    .venv/bin/python benchmarks/gpu_check.py --prepare .gpu         # here, once
    pip install --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl   # there
    PYTHONPATH=/tmp/site:server:common:testing:bench HF_HUB_OFFLINE=1 KVPILOT_CPU_KERNELS=0 \
        python3 benchmarks/gpu_check.py --tokenizer .gpu/tokenizer --out "$OUT" --record

`--record` writes benchmarks/results/gpu_check.json (docs/benchmarks.md is rendered from it) and
a copy beside the stages' files in --out, which is what comes back from a device machine.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

STAGE_BUDGET_S = {
    "preamble": 60,
    "ops": 90,
    "bundled": 60,
    "equivalence": 120,
    "quantizations": 90,
    "decode": 90,
    "throughput": 120,
}
# The wheels a GPU image may lack, for --prepare (what the engine imports beyond torch and
# transformers' own needs).
WHEELS = ("llguidance",)


class StageTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise StageTimeout("the stage ran past its time budget")


def run_stage(name: str, budget: float, fn: Callable[[], dict], out: Path, index: int) -> dict:
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(budget)))
    start = time.perf_counter()
    try:
        result = fn()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        lines = traceback.format_exc().strip().splitlines()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600], "trace": lines[-12:]}
    finally:
        signal.alarm(0)
    result = {"stage": name, "seconds": round(time.perf_counter() - start, 2), **result}
    (out / f"{index:02d}_{name}.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: result[k] for k in ("stage", "ok", "seconds")}), flush=True)
    return result


def preamble(device: torch.device) -> dict:
    import transformers

    from kvpilot_server.engine.models.model_setup import resolve_device

    report = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": str(device),
        "engine_device_auto": str(resolve_device("auto")),
        "cpu_kernels_env": os.environ.get("KVPILOT_CPU_KERNELS", "1"),
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        report |= {
            "name": torch.cuda.get_device_name(device),
            "capability": torch.cuda.get_device_capability(device),
            "memory_gib": round(total / 2**30, 1),
            "free_gib": round(free / 2**30, 1),
        }
    ok = device.type == "cpu" or report["engine_device_auto"].startswith("cuda")
    return {"ok": ok, **report}


def stages(device: torch.device, tokenizer: Path, work: Path) -> dict[str, Callable[[], dict]]:
    from kvpilot_testing import gpu_flash, gpu_models, gpu_ops, gpu_speed
    from kvpilot_testing.tiny import build_tiny_model

    cuda = device.type == "cuda"
    model_dtype = torch.bfloat16 if cuda else torch.float32
    shape = (32, 8, 128) if cuda else (4, 2, 64)

    def ops() -> dict:
        checks = {
            "fp8_linear": gpu_ops.fp8_linear(device, 4096 if cuda else 256),
            "paged_attention": gpu_ops.paged_attention_cases(device, model_dtype, shape),
            "sdpa_backends": gpu_flash.sdpa_backends(device, model_dtype, shape),
            "varlen_paged": gpu_flash.varlen_paged(device, model_dtype, shape),
        }
        return {"ok": all(c["ok"] for c in checks.values()), **checks}

    def equivalence() -> dict:
        families = ("llama", "mistral-window", "qwen3", "gemma2", "phi3") if cuda else ("llama",)
        checks = {}
        for name in families:
            path = build_tiny_model(name, work / name, tokenizer)
            checks[name] = gpu_models.hf_equivalence(device, path, 64 if cuda else 16)
        return {"ok": all(c["ok"] for c in checks.values()), **checks}

    def shaped(name: str, shapes: dict) -> Path:
        return gpu_models.config_only(work / name, tokenizer, shapes)

    small = gpu_models.SMALL
    speed_model = (
        (lambda: gpu_models.random_checkpoint(work / "smollm2-shaped", tokenizer, {}))
        if cuda
        else (lambda: gpu_models.random_checkpoint(work / "small", tokenizer, small))
    )
    return {
        "preamble": lambda: preamble(device),
        "ops": ops,
        "bundled": lambda: gpu_models.bundled_chat(device),
        "equivalence": equivalence,
        "quantizations": lambda: gpu_speed.quantizations(
            device, speed_model(), "bfloat16" if cuda else "float32"
        ),
        "decode": lambda: gpu_speed.batch1_decode(
            device,
            shaped("llama3-8b-shaped", gpu_models.LLAMA3_8B)
            if cuda
            else shaped("small-decode", small),
            (128, 2048) if cuda else (128,),
        ),
        "throughput": lambda: gpu_speed.throughput(
            device, speed_model(), (64, 256) if cuda else (8,), 128 if cuda else 16
        ),
    }


def prepare(target: Path) -> None:
    """Here, with the network: the bundled model's tokenizer and config (no weights) and the
    wheels a GPU image may lack, into a folder that travels with the working tree."""
    from kvpilot_common.naming import BUNDLED_MODEL
    from kvpilot_server.models.resolve import resolve_model
    from kvpilot_testing.gpu_models import TOKENIZER_FILES

    source = resolve_model(BUNDLED_MODEL)
    (target / "tokenizer").mkdir(parents=True, exist_ok=True)
    for name in (*TOKENIZER_FILES, "config.json"):
        if (source / name).is_file():
            (target / "tokenizer" / name).write_bytes((source / name).read_bytes())
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in WHEELS]
    # pip matches a manylinux tag exactly: name the glibc levels wheels are commonly built for.
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(target / "wheels"),
            *pins,
        ],
        check=True,
    )
    print(f"prepared {target}: tokenizer/ and wheels/ ({', '.join(pins)})")


def main() -> int:
    from kvpilot_testing import results

    run = results.Run.start("gpu_check")  # first: the load at start
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a rehearsal)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    parser.add_argument("--tokenizer", type=Path, help="default: the bundled model's directory")
    parser.add_argument("--stages", help="comma-separated subset, in the order above")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiplies each budget")
    parser.add_argument("--prepare", type=Path, help="write the travelling folder and stop")
    results.add_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.prepare:
        prepare(args.prepare)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"stage": "preamble", "ok": False, "error": "torch sees no CUDA device"}))
        return 1
    tokenizer = args.tokenizer
    if tokenizer is None:
        from kvpilot_common.naming import BUNDLED_MODEL
        from kvpilot_server.models.resolve import resolve_model

        tokenizer = resolve_model(BUNDLED_MODEL)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = set(args.stages.split(",")) if args.stages else None
    stage_results = []
    with tempfile.TemporaryDirectory(prefix="kvpilot-gpu-check-") as work:
        for index, (name, fn) in enumerate(stages(device, tokenizer, Path(work)).items()):
            if chosen is None or name in chosen:
                budget = STAGE_BUDGET_S[name] * args.budget_scale
                stage_results.append(run_stage(name, budget, fn, args.out, index))
    summary = {r["stage"]: {"ok": r["ok"], "seconds": r["seconds"]} for r in stage_results}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.record:
        done = {r["stage"]: r for r in stage_results}
        baseline = "the bandwidth bound (decode), Hugging Face generate (throughput)"
        path = run.record(headline(done), baseline, done)
        # Beside the stages too: from a device machine only --out comes back.
        (args.out / path.name).write_text(path.read_text())
    return 0 if all(r["ok"] for r in stage_results) else 1


def headline(done: dict[str, dict]) -> list:
    """The figures docs/benchmarks.md shows: each stage passed or not, decode against the
    bound, throughput against Hugging Face."""
    from kvpilot_testing.results import figure

    rows = [figure(f"{name} passed", "bool", int(bool(r["ok"]))) for name, r in done.items()]
    for key, value in done.get("decode", {}).items():
        if key.startswith("context_") and isinstance(value, dict):
            rows.append(
                figure(
                    f"batch-1 decode, {key}",
                    "ms/token",
                    value.get("ms_per_token"),
                    value.get("bound_ms"),
                )
            )
    for key, value in done.get("throughput", {}).items():
        if key.startswith("prompts_") and isinstance(value, dict):
            rows.append(
                figure(
                    f"throughput, {key}", "tok/s", value.get("kvpilot_tok_s"), value.get("hf_tok_s")
                )
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
