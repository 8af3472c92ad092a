"""Decode attention benchmark: the compiled CPU kernel (kernels/csrc/paged_decode.cpp) against
PyTorch's reference path (gather the blocks, masked SDPA) and against the time the same bytes
take to cross memory at the fastest rate this host was measured to read or copy memory
(engine_throughput.memory_bandwidth_gbs). Prints one JSON document.

Each case is one decode step of SmolLM2-135M's attention shapes (9 query heads, 3 kv heads,
head_dim 64, 16-token blocks) over 30 layers, each layer its own cache with its blocks in a
shuffled order, as a long-running cache holds them: a step reads every layer's keys and values
once, from memory, not from the last layer's cache lines; on huge pages, as the engine allocates
its cache (engine/huge_pages.py). Cases: batch 1 at context 2048, 8 at
512, and a mixed-load batch of 43 (the mean running batch of engine_throughput's workload) at
contexts of 100-800 tokens. float32 cache, fixed seed; best of five steps.
"""

import argparse
import json
import random
import time

import torch
from engine_throughput import memory_bandwidth_gbs  # the sibling benchmark, beside this file

from kvpilot_server.engine import huge_pages
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    Workspace,
    paged_attention,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import LayerCache
from kvpilot_testing import results
from kvpilot_testing.machine import engine_machine

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 9, 3, 64, 16, 30
CASES = {"batch 1, context 2048": [2048], "batch 8, context 512": [512] * 8}


def mixed_lengths(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(100, 800) for _ in range(43)]


def layer(lens: list[int], rng: torch.Generator) -> tuple[LayerCache, torch.Tensor]:
    widths = [-(-n // BLOCK) for n in lens]
    blocks = sum(widths) + 1
    k, v = (torch.empty(blocks, BLOCK, KV_HEADS, HEAD_DIM) for _ in range(2))
    for tensor in (k, v):
        huge_pages.advise(tensor)  # before the first write, as kv_cache.allocate does
        tensor.normal_(generator=rng)
    cache = LayerCache(k, v)
    order, tables = torch.randperm(blocks, generator=rng), torch.zeros(len(lens), max(widths))
    at = 0
    for row, width in enumerate(widths):
        tables[row, :width] = order[at : at + width]
        at += width
    return cache, tables.long()


def metadata(tables: torch.Tensor, lens: list[int], kernel) -> AttentionMetadata:
    rows, width = tables.shape
    context = torch.tensor(lens)
    mask = None if kernel else visible_keys(context - 1, width * BLOCK, None)[None, :, None]
    slots = torch.stack(
        [tables[i, (n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK for i, n in enumerate(lens)]
    )
    group = DecodeGroup(0, rows, tables.flatten(), width, mask, context)
    return AttentionMetadata(slots, None, kernel, decodes=[group])


def step_ms(layers, lens: list[int], kernel, runs: int = 5) -> float:
    """Best of `runs` decode steps, every layer once, through paged_attention (which also
    writes the step's new keys and values, as in the engine)."""
    rng = torch.Generator().manual_seed(1)
    q = torch.randn(len(lens), HEADS, HEAD_DIM, generator=rng)
    k, v = (torch.randn(len(lens), KV_HEADS, HEAD_DIM, generator=rng) for _ in range(2))
    return best_step_ms(layers, [metadata(t, lens, kernel) for _, t in layers], q, k, v, runs)


def best_step_ms(layers, metas, q, k, v, runs: int) -> float:
    """Best of `runs` passes of paged_attention over every layer with its metadata, in ms."""
    workspace, best = Workspace(), float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for (cache, _), meta in zip(layers, metas, strict=True):
            paged_attention(q, k, v, cache, meta, workspace)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    run = results.Run.start("decode_attention")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-reference", action="store_true", help="only time the kernel")
    results.add_argument(parser)
    args = parser.parse_args()
    kernel = cpu_kernels.load()
    if kernel is None:
        raise SystemExit("the CPU kernels did not build on this machine: nothing to measure")
    bandwidth = memory_bandwidth_gbs()
    cases = {**CASES, "batch 43, contexts 100-800": mixed_lengths(args.seed)}
    result = {"machine": engine_machine(), "memory_bandwidth_gbs": round(bandwidth, 1), "cases": {}}
    rng = torch.Generator().manual_seed(args.seed)
    for name, lens in cases.items():
        layers = [layer(lens, rng) for _ in range(LAYERS)]
        kv_bytes = sum(lens) * KV_HEADS * HEAD_DIM * 4 * 2 * LAYERS
        case = {
            "tokens": sum(lens),
            "kv_bytes_per_step": kv_bytes,
            "bound_ms": round(kv_bytes / bandwidth / 1e6, 2),
            "kernel_ms": round(step_ms(layers, lens, kernel), 2),
        }
        if not args.skip_reference:
            case["reference_ms"] = round(step_ms(layers, lens, None), 2)
        case["kernel_gbs"] = round(kv_bytes / case["kernel_ms"] / 1e6, 1)
        result["cases"][name] = case
        del layers
    print(json.dumps(result, indent=2))
    if args.record:
        figures = []
        for name, case in result["cases"].items():
            ms, ref = case["kernel_ms"], case.get("reference_ms")
            figures.append(results.figure(f"{name}: vs PyTorch", "ms/step", ms, ref))
            figures.append(
                results.figure(f"{name}: vs the memory bound", "ms/step", ms, case["bound_ms"])
            )
        baseline = "PyTorch's reference path (gather + SDPA), same run; the memory-bandwidth bound"
        run.record(figures, baseline, result)


if __name__ == "__main__":
    main()
