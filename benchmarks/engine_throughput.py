"""Engine benchmark: kvpilot vs Hugging Face generate() on one mixed workload, plus batch-1
decode latency next to the memory-bandwidth bound. Prints one JSON document. On CPUs that
multiply bfloat16 in hardware (AMX, where dtype auto means it, or AVX-512 BF16) it also runs both
with bfloat16 matrices (kvpilot's dtype bfloat16 on CPU; Hugging Face's bfloat16 model).

Workload (fixed seed): N requests, prompt lengths 32-512 tokens of real text, outputs 16-256
tokens, all submitted at once. kvpilot runs them with continuous batching; HF runs static
batches of 8, left-padded, each batch generating its longest request's length. Both count only
the tokens each request asked for (EOS ignored, so both produce exactly that many).
"""

import argparse
import json
import random
import statistics
import time
from collections.abc import Iterable

import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine import huge_pages
from kvpilot_server.engine.layers.half_matrices import bfloat16_capable
from kvpilot_testing import results
from kvpilot_testing.corpus import CORPUS  # the same real text the tests slice prompts from
from kvpilot_testing.machine import engine_machine

MODEL = "builtin://smollm2-135m-instruct"


def workload(tokenizer, n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    ids = tokenizer(CORPUS).input_ids
    ids = ids * (4096 // len(ids) + 1)
    requests = []
    for _ in range(n):
        length, start = rng.randint(32, 512), rng.randrange(0, len(ids) - 600)
        requests.append((ids[start : start + length], rng.randint(16, 256)))
    return requests


def run_kvpilot(llm: LLM, requests) -> dict:
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in requests]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == sum(m for _, m in requests)
    stats = llm.engine.stats()
    return {
        "elapsed_s": round(elapsed, 2),
        "output_tokens": produced,
        "output_tokens_per_s": round(produced / elapsed, 2),
        "preemptions": stats.num_preemptions,
    }


def run_hf(model, requests, batch_size: int, pad_id: int) -> dict:
    requested, start = 0, time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        width, new = max(len(p) for p, _ in batch), max(m for _, m in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        with torch.inference_mode():
            model.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=pad_id,
            )
        requested += sum(m for _, m in batch)
    elapsed = time.perf_counter() - start
    return {
        "elapsed_s": round(elapsed, 2),
        "output_tokens": requested,
        "output_tokens_per_s": round(requested / elapsed, 2),
        "batch_size": batch_size,
    }


def decode_ms_per_token(llm: LLM, prompt: list[int], tokens: int, runs: int) -> float:
    """Median over runs of (time for `tokens` decode steps) / tokens, prefill excluded."""
    samples = []
    for _ in range(runs):
        engine = llm.engine
        engine.add_request(
            "b1", prompt, SamplingParams(max_tokens=tokens + 1, ignore_eos=True, temperature=0.0)
        )
        engine.step()  # prefill and first token
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        samples.append((time.perf_counter() - start) * 1000 / tokens)
    return statistics.median(samples)


def hf_decode_ms_per_token(model, prompt: list[int], tokens: int) -> float:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        first = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1, do_sample=False)
        total = time.perf_counter() - start
    return (total - first) * 1000 / tokens


def memory_bandwidth_gbs(
    weights: Iterable[torch.Tensor] = (), size_mib: int = 512, runs: int = 5
) -> float:
    """The fastest this host was seen to move memory: the best of a read-only pass (a sum) over
    the weights a decode step reads, in place, on the pages they sit on; the same over a buffer
    of size_mib; and a copy of that buffer (bytes read + written per second); each the best of
    runs. The buffer asks for huge pages before its first write, as the model's weights and
    cache do (engine/huge_pages.py): on 4 KiB pages reads run well under that rate, and a bound
    measured there would flatter a decode step. This host's bandwidth swings by a third within
    minutes, so the bound is what the memory did at its best, not on average."""
    weights = list(weights)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    src = torch.empty(size_mib << 18)  # float32: 4 bytes each
    dst = torch.empty_like(src)
    for buffer in (src, dst):
        huge_pages.advise(buffer)
        buffer.fill_(1.0)
    best = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        src.sum()
        best = max(best, src.numel() * 4 / (time.perf_counter() - start) / 1e9)
        if weights:
            start = time.perf_counter()
            for weight in weights:
                weight.sum()
            best = max(best, weight_bytes / (time.perf_counter() - start) / 1e9)
    return best


def _engine(args: argparse.Namespace, dtype: str) -> LLM:
    return LLM(
        MODEL,
        dtype=dtype,
        max_model_len=1024,
        kv_cache_bytes=4 << 30,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )


def main() -> None:
    run = results.Run.start("engine_throughput")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-hf", action="store_true", help="only measure kvpilot")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument(
        "--no-bfloat16",
        dest="bfloat16",
        action="store_false",
        help="skip the bfloat16 runs (they only run on CPUs with AMX or AVX-512 BF16)",
    )
    results.add_argument(parser)
    args = parser.parse_args()

    bfloat16 = args.bfloat16 and bfloat16_capable()
    llm = _engine(args, "float32")
    requests = workload(llm.tokenizer, args.requests, args.seed)
    weights = [p.detach() for p in llm.engine.model.parameters()]
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    prompt = requests[0][0][:32]
    result = {
        "machine": engine_machine(),
        "model": MODEL,
        "dtype": "float32",
        "workload": {
            "requests": len(requests),
            "prompt_tokens": sum(len(p) for p, _ in requests),
            "requested_output_tokens": sum(m for _, m in requests),
            "seed": args.seed,
        },
        "kvpilot": run_kvpilot(llm, requests),
    }
    # The bound measured next to the decode it bounds, before and after it.
    bandwidth = memory_bandwidth_gbs(weights)
    decode_ms = decode_ms_per_token(llm, prompt, args.decode_tokens, 3)
    bandwidth = max(bandwidth, memory_bandwidth_gbs(weights))
    bound_ms = weight_bytes / (bandwidth * 1e9) * 1000
    result |= {
        "batch1_decode": {
            "kvpilot_ms_per_token": round(decode_ms, 2),
            "weight_bytes": weight_bytes,
            "measured_bandwidth_gbs": round(bandwidth, 1),
            "bandwidth_bound_ms_per_token": round(bound_ms, 2),
        },
    }
    b1 = result["batch1_decode"]
    b1["fraction_of_bound"] = round(bound_ms / b1["kvpilot_ms_per_token"], 3)
    path = llm.engine.model_path
    del llm, weights
    if bfloat16:  # bfloat16 matrices in a float32 model (engine/layers/half_matrices.py)
        llm = _engine(args, "bfloat16")
        result["kvpilot_bfloat16"] = run_kvpilot(llm, requests)
        b1["kvpilot_bfloat16_ms_per_token"] = round(
            decode_ms_per_token(llm, prompt, args.decode_tokens, 3), 2
        )
        del llm
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        b1["hf_ms_per_token"] = round(hf_decode_ms_per_token(hf, prompt, args.decode_tokens), 2)
        result["hf_generate"] = run_hf(hf, requests, 8, hf.config.eos_token_id)
        hf_rate = result["hf_generate"]["output_tokens_per_s"]
        result["throughput_ratio"] = round(result["kvpilot"]["output_tokens_per_s"] / hf_rate, 2)
        if bfloat16:
            rate = result["kvpilot_bfloat16"]["output_tokens_per_s"]
            result["throughput_ratio_bfloat16"] = round(rate / hf_rate, 2)
            # Hugging Face's own bfloat16 on the same CPU, for the like-for-like ratio.
            del hf
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
            result["hf_generate_bfloat16"] = run_hf(hf, requests, 8, hf.config.eos_token_id)
            hf_half = result["hf_generate_bfloat16"]["output_tokens_per_s"]
            result["throughput_ratio_bfloat16_vs_hf_bfloat16"] = round(rate / hf_half, 2)
    print(json.dumps(result, indent=2))
    if args.record:
        baseline = "Hugging Face generate, same run (the bound: the fastest read or copy measured)"
        run.record(_figures(result), baseline, result)


def _figures(result: dict) -> list[results.Figure]:
    b1, hf = result["batch1_decode"], result.get("hf_generate", {})
    hf_half = result.get("hf_generate_bfloat16", {})
    rate = "output_tokens_per_s"
    figures = [
        results.figure("mixed workload, float32", "tok/s", result["kvpilot"][rate], hf.get(rate)),
        results.figure(
            "batch-1 decode, float32",
            "ms/token",
            b1["kvpilot_ms_per_token"],
            b1.get("hf_ms_per_token"),
        ),
        results.figure(
            "batch-1 decode against the bandwidth bound",
            "ms/token",
            b1["kvpilot_ms_per_token"],
            b1["bandwidth_bound_ms_per_token"],
        ),
    ]
    if "kvpilot_bfloat16" in result:  # only on CPUs with bfloat16 products
        half = result["kvpilot_bfloat16"][rate]
        figures.append(results.figure("mixed workload, bfloat16", "tok/s", half, hf_half.get(rate)))
        half_b1 = b1["kvpilot_bfloat16_ms_per_token"]
        figures.append(results.figure("batch-1 decode, bfloat16 matrices", "ms/token", half_b1))
    return figures


if __name__ == "__main__":
    main()
