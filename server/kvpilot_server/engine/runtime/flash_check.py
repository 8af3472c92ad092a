"""The start-up check of the flash attention path (layers/flash_attention.py) on the model's own
heads: one small step, a few decodes of different lengths and a chunk over cached context, run
through both paths on a scratch cache of the model's layout, under each of the model's windows.
The model runner serves on the flash path only if they agree."""

import torch

from kvpilot_server.engine.layers.attention import Workspace, paged_attention
from kvpilot_server.engine.layers.kv_cache import LayerCache
from kvpilot_server.engine.runtime.scheduler_output import ScheduledSeq

# (tokens cached, tokens in the step) per sequence: three decodes, then a later prefill chunk.
STEP = ((0, 1), (16, 1), (39, 1), (20, 9))


def both_attentions(runner) -> tuple[torch.Tensor, torch.Tensor]:
    """(flash, reference) outputs of the same step, stacked over the model's windows."""
    cfg, block_size, device = runner.model.cfg, runner.block_size, runner.device
    dtype = runner.kv_cache[0].k.dtype
    widths = [-(-(computed + n) // block_size) for computed, n in STEP]
    order = torch.randperm(sum(widths) + 2).tolist()  # blocks in no particular order
    seqs, start = [], 0
    for (computed, n), width in zip(STEP, widths, strict=True):
        table = order[start : start + width]
        start += width
        seqs.append(ScheduledSeq(computed, n, computed + n, table))
    slots = torch.tensor(
        [
            seq.block_table[p // block_size] * block_size + p % block_size
            for seq in seqs
            for p in range(seq.computed, seq.computed + seq.n)
        ],
        device=device,
    )
    shape = (len(order), block_size, cfg.num_kv_heads, cfg.head_dim)
    keys, values = (torch.randn(shape, dtype=dtype, device=device) for _ in range(2))
    rows = len(slots)
    q = torch.randn(rows, cfg.num_heads, cfg.head_dim, dtype=dtype, device=device)
    k, v = (
        torch.randn(rows, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
        for _ in range(2)
    )
    outs = []
    serving = runner.flash
    try:
        for flash in (True, False):
            runner.flash = flash
            per_window = []
            for window in runner.windows:
                meta = runner._metadata(seqs, slots, window)
                cache = LayerCache(keys.clone(), values.clone())
                per_window.append(
                    paged_attention(q, k, v, cache, meta, Workspace(), cfg.attention_scale)
                )
            outs.append(torch.stack(per_window))
    finally:
        runner.flash = serving
    return outs[0], outs[1]
