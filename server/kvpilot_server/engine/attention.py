"""Paged attention, CPU reference path.

New K/V are written into their cache slots first; each query then attends to its sequence's
keys gathered through the block table. Decodes (one query each) run in a few padded groups of
similar context length; prefill chunks run one sequence at a time so a long chunk never pads a
batch of decodes. Masks are explicit: SDPA's `is_causal` aligns the top-left corner, which is
wrong whenever the query is a later chunk of a longer context.

Gathers write into a reusable workspace: a fresh tensor of tens of MB per layer would be
mmapped and page-faulted on every call, which costs more than the copy itself.
"""

from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    start: int  # rows [start, end) of the flattened batch, one query per sequence
    end: int
    block_ids: torch.Tensor  # [rows * blocks] each sequence's block table, padded to `blocks`
    blocks: int
    # [1, rows, 1, blocks * block_size] bool, which keys each row sees; None when the kernel
    # serves the group (it reads each row's length and window itself).
    mask: torch.Tensor | None
    context_lens: torch.Tensor  # [rows] tokens each row attends to (its own included)


@dataclass
class PrefillChunk:
    start: int  # rows [start, end) of the flattened batch
    end: int
    block_ids: torch.Tensor  # the sequence's blocks covering its context
    context_len: int  # tokens attended to, including this chunk
    mask: torch.Tensor | None  # [n, context_len] bool; None: plain causal over fresh tokens


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [N] cache slot of each new token
    window: int | None = None  # sliding window of the layers this metadata serves
    kernel: ModuleType | None = None  # compiled CPU decode kernel, when available
    decodes: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)


class Workspace:
    """Grow-only scratch buffers for gathered keys and values."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = [torch.empty(0), torch.empty(0)]

    def view(self, which: int, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        numel = 1
        for dim in shape:
            numel *= dim
        buf = self.buffers[which]
        if buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.buffers[which] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel].view(shape)


def visible_keys(positions: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """[len(positions), num_keys] bool: key j is visible to a query at position p when j <= p
    (and p - j < window on sliding-window layers). One rule for prefill chunks and decodes."""
    q = positions.unsqueeze(1)
    k = torch.arange(num_keys).unsqueeze(0)
    mask = k <= q
    if window is not None:
        mask &= q - k < window
    return mask


def paged_attention(
    q: torch.Tensor,  # [N, heads, head_dim]
    k: torch.Tensor,  # [N, kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    workspace: Workspace,
) -> torch.Tensor:
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
    if len(meta.decodes) == 1 and not meta.prefills:  # the common pure-decode step
        return _decode(q, k_cache, v_cache, meta, meta.decodes[0], workspace)
    out = torch.empty_like(q)
    for group in meta.decodes:
        rows = slice(group.start, group.end)
        out[rows] = _decode(q[rows], k_cache, v_cache, meta, group, workspace)
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill(q, k, v, k_cache, v_cache, chunk, workspace)
    return out


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Blocks of the cache, in block-id order, copied into `out` [len(ids), block_size, ...]."""
    return torch.index_select(cache, 0, block_ids, out=out)


def _decode(q, k_cache, v_cache, meta, group: DecodeGroup, workspace) -> torch.Tensor:
    rows, (_, block_size, kv_heads, head_dim) = group.end - group.start, k_cache.shape
    if meta.kernel is not None:
        tables = group.block_ids.view(rows, group.blocks)
        scale = head_dim**-0.5
        window = meta.window or 0
        return meta.kernel.paged_decode(
            q.contiguous(), k_cache, v_cache, tables, group.context_lens, scale, window
        )
    shape = (group.block_ids.numel(), block_size, kv_heads, head_dim)
    context = rows, group.blocks * block_size, kv_heads, head_dim
    # [kv_heads, rows, L, head_dim]: sequences play SDPA's "heads" and each kv head's query
    # group plays its "queries", so grouped-query attention needs no repeated keys.
    keys = _gather(k_cache, group.block_ids, workspace.view(0, shape, k_cache))
    values = _gather(v_cache, group.block_ids, workspace.view(1, shape, v_cache))
    keys = keys.view(context).permute(2, 0, 1, 3)
    values = values.view(context).permute(2, 0, 1, 3)
    queries = q.view(rows, kv_heads, -1, head_dim).transpose(0, 1)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask)
    return out.transpose(0, 1).reshape(rows, -1, head_dim)


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, workspace) -> torch.Tensor:
    # 4-D inputs ([1, heads, n, head_dim]): with 3-D ones PyTorch's CPU SDPA takes its slow
    # math path (measured 4x slower for a 300-token prompt).
    query = q[chunk.start : chunk.end].transpose(0, 1)[None]
    if chunk.mask is None:
        # No cached context: the chunk's own fresh K/V are the whole context.
        keys = k[chunk.start : chunk.end].transpose(0, 1)[None]
        values = v[chunk.start : chunk.end].transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
    else:
        _, block_size, kv_heads, head_dim = k_cache.shape
        shape = (chunk.block_ids.numel(), block_size, kv_heads, head_dim)
        keys = _gather(k_cache, chunk.block_ids, workspace.view(0, shape, k_cache))
        values = _gather(v_cache, chunk.block_ids, workspace.view(1, shape, v_cache))
        keys = keys.flatten(0, 1)[: chunk.context_len].transpose(0, 1)[None]
        values = values.flatten(0, 1)[: chunk.context_len].transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=chunk.mask, enable_gqa=True
        )
    return out[0].transpose(0, 1)
