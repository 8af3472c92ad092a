"""torch.nn.attention.varlen.varlen_attn's documented contract, computed densely on any device:
the stand-in the CPU tests give kvpilot's flash attention path (engine/layers/flash_attention.py),
whose real kernel runs on CUDA only."""

import torch

from kvpilot_server.engine.layers.attention import visible_keys


def varlen_standin(q, cache, batch, window, scale, *, shift: int = 0):
    """varlen_attn's contract, densely: sequence i's queries are rows cu[i]..cu[i+1], its keys
    the first seqused[i] of its pages in block-table order, the causal mask aligned to the end
    of its keys, window_size (w - 1, 0) keeping the w keys up to the query's own. `shift`
    moves every query one key later: a plausible bug the self-test must catch."""
    out = torch.empty_like(q)
    cu, used = batch.cu_seq_q.tolist(), batch.seqused_k.tolist()
    # The kernel's entry check wants both cumulative tensors; the keys' must add up the lengths.
    assert batch.cu_seq_k.tolist() == [sum(used[:i]) for i in range(len(used) + 1)]
    assert batch.block_table.dtype == batch.seqused_k.dtype == torch.int32
    for i, length in enumerate(used):
        rows = slice(cu[i], cu[i + 1])
        pages = batch.block_table[i].long()
        keys = cache.k[pages].flatten(0, 1)[:length]
        values = cache.v[pages].flatten(0, 1)[:length]
        n = cu[i + 1] - cu[i]
        positions = torch.arange(length - n, length) + shift
        mask = visible_keys(positions, length, window)
        group = q.shape[1] // keys.shape[1]
        k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        v = values.repeat_interleave(group, dim=1).transpose(0, 1)
        logits = q[rows].transpose(0, 1) @ k.transpose(1, 2) * (scale or q.shape[-1] ** -0.5)
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        out[rows] = (weights @ v).transpose(0, 1)
    return out
