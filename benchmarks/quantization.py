"""Quantization benchmark: SmolLM2 per weight and KV cache precision, side by side in one run.
Prints JSON.

Runs `kvpilot eval` (each config in a fresh process, so resident memory is its own): decode
tokens/s at batch 1 (median of 3 runs, prefill excluded), output tokens/s at batch 32 (32
prompts of 64 tokens, 64 new tokens each, all at once), peak resident memory, weight and KV
cache bytes, and the quality figures next to them. Adds each config's speed-up over float32.
Target: int8 >= 1.5x float32 decode speed at batch 1 (anchor: gpt-fast's 1.48x on GPU).
"""

import argparse
import json
import os
import platform
import subprocess
import sys

from kvpilot_testing import results


def main() -> None:
    run = results.Run.start("quantization")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        default="none,int8,int4,int4-g64,none:int8,int8:int8,int8+lm_head-int8,int4+lm_head-int8",
    )
    parser.add_argument("--tokens", default="4096", help="perplexity tokens")
    results.add_argument(parser)
    args = parser.parse_args()
    command = [sys.executable, "-m", "kvpilot_common.cli", "eval", "--json"]
    command += ["--configs", args.configs, "--tokens", args.tokens, "--speed-tokens", "64"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if not done.stdout:
        sys.exit(done.stderr)
    report = json.loads(done.stdout)
    base = report["configs"][report["baseline"]]
    for figures in report["configs"].values():
        if "error" not in figures:
            for key in ("batch1_decode_tokens_per_s", "batch32_output_tokens_per_s"):
                figures[key.replace("tokens_per_s", "speedup_vs_float32")] = round(
                    figures[key] / base[key], 2
                )
    report["machine"] = {"cpus": os.cpu_count(), "processor": platform.processor()}
    report["target"] = {
        "int8_batch1_speedup_vs_float32": 1.5,
        "met": report["configs"].get("int8", {}).get("batch1_decode_speedup_vs_float32", 0) >= 1.5,
    }
    print(json.dumps(report, indent=2))
    if args.record:
        baseline = f"{report['baseline']} (float32 on CPU), same run"
        run.record(_figures(report["configs"], report["baseline"]), baseline, report)


def _figures(configs: dict, baseline: str) -> list[results.Figure]:
    base = configs[baseline]
    rows = [
        ("batch-1 decode", "tok/s", "batch1_decode_tokens_per_s"),
        ("batch-32 output", "tok/s", "batch32_output_tokens_per_s"),
        ("perplexity", "", "perplexity"),
    ]
    return [
        results.figure(f"{name}: {what}", unit, figures.get(key), base.get(key))
        for name, figures in configs.items()
        if name != baseline and "error" not in figures
        for what, unit, key in rows
    ]


if __name__ == "__main__":
    main()
