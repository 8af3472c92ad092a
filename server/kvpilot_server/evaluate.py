"""`kvpilot eval`: what a weight or KV cache precision costs on a model, in one command.

Each config runs in a fresh process, so its peak resident memory is its own. Per config: the
dtype it ran in, perplexity on held-out natural text, greedy agreement with the baseline (the
exact model: no quantization, float32 on a CPU, the model dtype on a GPU; teacher-forced, the
share of the baseline's own greedy tokens that the config also ranks first after the same
prefix), decode tokens/s at batch 1, output tokens/s at batch 32, resident memory while serving
and its peak (loading included), weight and KV cache bytes.
The KV cache holds the same number of tokens in every config, so its bytes show what a cache
precision saves.

The text is read at run time from what is installed (Python's own documentation, prose
paragraphs only), or from --text; nothing is copied into the repository.
"""

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from kvpilot_common import precision
from kvpilot_common.naming import BUNDLED_MODEL
from kvpilot_common.prose import default_text
from kvpilot_server.eval_job import Job

LM_HEAD = "+lm_head-"  # a config's lm_head suffix, e.g. int4-g32+lm_head-int8


def parse_configs(
    spec: str, kv_default: str, group_default: int
) -> list[tuple[str, int, str, str, str]]:
    """'none,int8+lm_head-int8,int4-g64:int8,none@bfloat16' -> [(quantization, group size,
    kv_cache_dtype, lm_head_quantization, dtype), ...]; '-gN', '+lm_head-Q', '@DTYPE' and ':KV'
    override --quantization-group-size, the unquantized lm_head, the model dtype (auto) and
    --kv-cache-dtype for one config."""
    configs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        weights, _, kv = item.partition(":")
        weights, _, dtype = weights.partition("@")
        weights, _, lm_head = weights.partition(LM_HEAD)
        quantization, _, group = weights.partition("-g")
        configs.append(
            (
                quantization,
                int(group) if group else group_default,
                kv or kv_default,
                lm_head or precision.DEFAULT_LM_HEAD_QUANTIZATION,
                dtype or precision.DEFAULT_DTYPE,
            )
        )
    return configs


def add_eval_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=BUNDLED_MODEL)
    parser.add_argument(
        "--configs",
        default="none,int8,int4",
        help="weight quantizations, QUANT[-gGROUP][+lm_head-int8][@DTYPE][:KV_DTYPE], "
        "e.g. none,int8,int4-g64:int8,int4+lm_head-int8,none@bfloat16",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default=precision.DEFAULT_KV_CACHE_DTYPE,
        help=f"KV dtype for every config: {', '.join(precision.KV_CACHE_DTYPES)}",
    )
    parser.add_argument(
        "--quantization-group-size",
        type=int,
        default=precision.INT4_DEFAULT_GROUP_SIZE,
        help=f"int4 only: {', '.join(map(str, precision.INT4_GROUP_SIZES))}",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--text", help="a UTF-8 text file (default: Python's documentation)")
    parser.add_argument("--tokens", type=int, default=8192, help="perplexity tokens")
    parser.add_argument("--window", type=int, default=512, help="perplexity window, tokens")
    parser.add_argument("--prompts", type=int, default=32, help="agreement prompts")
    parser.add_argument("--new-tokens", type=int, default=32, help="agreement tokens per prompt")
    parser.add_argument(
        "--speed-tokens", type=int, default=64, help="tokens per request when timing; 0: skip"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_eval(args: argparse.Namespace) -> int:
    text = Path(args.text).read_text(encoding="utf-8") if args.text else default_text()
    base = dict(
        model=args.model,
        device=args.device,
        text=text,
        tokens=args.tokens,
        window=args.window,
        prompts=args.prompts,
        new_tokens=args.new_tokens,
        speed_tokens=args.speed_tokens,
    )
    configs = parse_configs(args.configs, args.kv_cache_dtype, args.quantization_group_size)
    from kvpilot_server.engine.models.model_setup import dtype_name, resolve_device

    device = resolve_device(args.device)
    # The baseline is the exact model, nothing quantized: float32 on a CPU (where auto may mean
    # bfloat16 matrices, a precision measured like any other), the model dtype on a GPU. It runs
    # anyway, so a config that means the same is not repeated.
    reference = precision.AUTO_DTYPE_CPU if device.type == "cpu" else precision.DEFAULT_DTYPE
    none, auto = precision.DEFAULT_QUANTIZATION, precision.DEFAULT_KV_CACHE_DTYPE
    group = precision.INT4_DEFAULT_GROUP_SIZE
    baseline_job = Job(
        quantization=none, group_size=group, kv_cache_dtype=auto, dtype=reference, **base
    )
    unquantized = (none, auto, precision.DEFAULT_LM_HEAD_QUANTIZATION)
    exact = dtype_name(reference, device)
    configs = [
        c for c in configs if (c[0], c[2], c[3]) != unquantized or dtype_name(c[4], device) != exact
    ]
    baseline = _in_fresh_process(baseline_job)
    if "error" in baseline:
        print(f"kvpilot eval: baseline failed: {baseline['error']}", file=sys.stderr)
        return 1
    continuations = baseline.pop("continuations")
    results = {baseline_job.name: baseline}
    for quantization, group, kv, lm_head, dtype in configs:
        job = Job(
            quantization=quantization,
            group_size=group,
            kv_cache_dtype=kv,
            lm_head_quantization=lm_head,
            dtype=dtype,
            continuations=continuations,
            **base,
        )
        results[job.name] = _in_fresh_process(job)
    for figures in results.values():
        if "perplexity" in figures:
            figures["perplexity_vs_baseline"] = round(
                figures["perplexity"] / baseline["perplexity"], 4
            )
    report = {
        "model": args.model,
        "text_source": args.text or "pydoc_data",
        "baseline": baseline_job.name,
        "configs": results,
    }
    print(json.dumps(report, indent=2) if args.json else _table(results))
    return 1 if any("error" in r for r in results.values()) else 0


def _in_fresh_process(job: Job) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "kvpilot_server.eval_job"],
        input=json.dumps(asdict(job)),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        return {"error": lines[-1]}  # e.g. a ConfigError: fp8 weights need a CUDA GPU ...
    return json.loads(done.stdout)


_COLUMNS = [
    ("dtype", "dtype"),
    ("perplexity", "ppl"),
    ("perplexity_vs_baseline", "ppl/base"),
    ("greedy_agreement", "agree"),
    ("batch1_decode_tokens_per_s", "tok/s b1"),
    ("batch32_output_tokens_per_s", "tok/s b32"),
    ("rss_mib", "RSS MiB"),
    ("peak_rss_mib", "peak MiB"),
    ("weight_mib", "weights MiB"),
    ("kv_cache_mib", "KV MiB"),
]


def _table(results: dict[str, dict]) -> str:
    width = max(16, *(len(name) + 1 for name in results))
    lines = [f"{'config':<{width}}" + "".join(f"{title:>12}" for _, title in _COLUMNS)]
    for name, figures in results.items():
        if "error" in figures:
            lines.append(f"{name:<{width}}  error: {figures['error']}")
            continue
        cells = [figures.get(key, "-") for key, _ in _COLUMNS]
        lines.append(f"{name:<{width}}" + "".join(f"{cell:>12}" for cell in cells))
    return "\n".join(lines)
