"""Quantization benchmark: SmolLM2 per weight format, side by side in one run. Prints JSON.

Per format: batch-1 decode ms/token (median of 3 runs, prefill excluded), batch-32 output
tokens/s (32 prompts of 64 tokens, 64 new tokens each, all at once), and the bytes of the
model's weights. Target: int8 >= 1.5x float32 decode speed at batch 1.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import MODEL, decode_ms_per_token, workload

from kvpilot_server import LLM, SamplingParams


def measure(method: str) -> dict:
    llm = LLM(MODEL, max_model_len=1024, kv_cache_bytes=1 << 30, quantization=method)
    model = llm.engine.model
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum({t.data_ptr(): t.nbytes for t in tensors}.values())
    prompts = [p[:64] for p, _ in workload(llm.tokenizer, 32, seed=1)]
    decode = decode_ms_per_token(llm, prompts[0][:32], 64, 3)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return {
        "weight_bytes": weights,
        "batch1_decode_ms_per_token": round(decode, 2),
        "batch32_output_tokens_per_s": round(32 * 64 / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="none,int8")
    args = parser.parse_args()
    results = {method: measure(method) for method in args.formats.split(",")}
    base = results.get("none")
    if base:
        for _method, figures in results.items():
            figures["batch1_speedup_vs_float32"] = round(
                base["batch1_decode_ms_per_token"] / figures["batch1_decode_ms_per_token"], 2
            )
            figures["batch32_speedup_vs_float32"] = round(
                figures["batch32_output_tokens_per_s"] / base["batch32_output_tokens_per_s"], 2
            )
    print(json.dumps({"model": MODEL, "dtype": "float32", "formats": results}, indent=2))


if __name__ == "__main__":
    main()
