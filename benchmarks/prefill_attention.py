"""Prompt attention benchmark: the compiled CPU kernel (kernels/csrc/paged_prefill.cpp) against
PyTorch's reference path (per chunk: SDPA causal over a fresh prompt, or gather the context's
blocks and run a masked SDPA for a chunk that continues one). Prints one JSON document.

Each case is one prefill step of SmolLM2-135M's attention shapes (9 query heads, 3 kv heads,
head_dim 64, 16-token blocks) over 30 layers, each layer its own cache with its blocks in a
shuffled order, through paged_attention (which writes the chunk's keys and values first, as in
the engine). Cases: one prompt of 272 tokens (the mean of engine_throughput's workload), a full
2048-token chunk of prompts of 32-512 tokens (that workload's prefill steps), and a 512-token
chunk that continues a cached context of 1536 (a long prompt's last chunk, or a prefix-cache
hit). The attention's own multiply-adds (causal: half the square) give GFLOP/s. float32 cache,
fixed seed; best of three steps.
"""

import argparse
import json
import random

import torch
from decode_attention import (  # the sibling benchmark, beside this file: the same layers
    BLOCK,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    best_step_ms,
    layer,
)

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    PrefillBatch,
    PrefillChunk,
    visible_keys,
)
from kvpilot_testing import results
from kvpilot_testing.machine import engine_machine


def workload_chunk(seed: int) -> list[tuple[int, int]]:
    """Prompts of 32-512 tokens filling one 2048-token chunk (the last one cut to fit)."""
    rng, chunk, left = random.Random(seed), [], 2048
    while left:
        n = min(left, rng.randint(32, 512))
        chunk.append((0, n))
        left -= n
    return chunk


def metadata(tables: torch.Tensor, chunks, kernel) -> AttentionMetadata:
    positions = [torch.arange(cached, cached + n) for cached, n in chunks]
    slots = torch.cat([tables[i, p // BLOCK] * BLOCK + p % BLOCK for i, p in enumerate(positions)])
    meta = AttentionMetadata(slots, None, kernel)
    if kernel is not None:
        entries = [(c, n, tables[i].tolist()) for i, (c, n) in enumerate(chunks)]
        meta.prefill_batch = PrefillBatch.of(0, entries, BLOCK)
        return meta
    row = 0
    for i, (cached, n) in enumerate(chunks):
        mask = None if cached == 0 else visible_keys(positions[i], cached + n, None)
        blocks = tables[i, : -(-(cached + n) // BLOCK)]
        meta.prefills.append(PrefillChunk(row, row + n, blocks, cached + n, mask))
        row += n
    return meta


def step_ms(layers, chunks, kernel, runs: int = 3) -> float:
    rows = sum(n for _, n in chunks)
    rng = torch.Generator().manual_seed(1)
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=rng)
    q, k, v = qkv.split_with_sizes((HEADS, KV_HEADS, KV_HEADS), dim=1)  # as the model's views
    metas = [metadata(tables, chunks, kernel) for _, tables in layers]
    return best_step_ms(layers, metas, q, k, v, runs)


def flops(chunks) -> float:
    """Two products of head_dim multiply-adds per visible (query, key) pair, every head."""
    pairs = sum(n * cached + n * (n + 1) / 2 for cached, n in chunks)
    return 2 * 2 * pairs * HEAD_DIM * HEADS * LAYERS


def main() -> None:
    run = results.Run.start("prefill_attention")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    results.add_argument(parser)
    args = parser.parse_args()
    kernel = cpu_kernels.load()
    if kernel is None:
        raise SystemExit("the CPU kernels did not build on this machine: nothing to measure")
    cases = {
        "one prompt of 272": [(0, 272)],
        "a 2048-token chunk of prompts": workload_chunk(args.seed),
        "512 tokens after a cached 1536": [(1536, 512)],
    }
    result = {"machine": engine_machine(), "cases": {}}
    rng = torch.Generator().manual_seed(args.seed)
    for name, chunks in cases.items():
        contexts = [cached + n for cached, n in chunks]
        layers = [layer(contexts, rng) for _ in range(LAYERS)]
        case = {
            "chunks": len(chunks),
            "query_tokens": sum(n for _, n in chunks),
            "cached_tokens": sum(cached for cached, _ in chunks),
            "kernel_ms": round(step_ms(layers, chunks, kernel), 2),
            "reference_ms": round(step_ms(layers, chunks, None), 2),
        }
        case["kernel_gflops"] = round(flops(chunks) / case["kernel_ms"] / 1e6, 1)
        case["reference_gflops"] = round(flops(chunks) / case["reference_ms"] / 1e6, 1)
        result["cases"][name] = case
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(name, "ms/step", case["kernel_ms"], case["reference_ms"])
            for name, case in result["cases"].items()
        ]
        baseline = "PyTorch's reference path (SDPA per chunk; gather + masked SDPA after a cache)"
        run.record(figures, baseline, result)


if __name__ == "__main__":
    main()
