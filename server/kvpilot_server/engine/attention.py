"""Paged attention, CPU reference path.

New K/V are written into their cache slots first; each query then attends to its sequence's
keys gathered through the block table. Decodes (one query each) run as one padded batch;
prefill chunks run one sequence at a time so a long chunk never pads a batch of decodes.
Masks are explicit: SDPA's `is_causal` aligns the top-left corner, which is wrong whenever the
query is a later chunk of a longer context.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


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
    num_decodes: int = 0  # the first rows of the batch are decodes
    decode_block_tables: torch.Tensor | None = None  # [D, max_blocks]
    decode_mask: torch.Tensor | None = None  # [D, 1, 1, max_blocks * block_size] bool
    prefills: list[PrefillChunk] = field(default_factory=list)


def causal_mask(
    query_start: int, num_queries: int, context_len: int, window: int | None
) -> torch.Tensor:
    """[num_queries, context_len] bool: key j is visible to query at position p when j <= p
    (and p - j < window for sliding-window layers)."""
    q = torch.arange(query_start, query_start + num_queries).unsqueeze(1)
    k = torch.arange(context_len).unsqueeze(0)
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
) -> torch.Tensor:
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    if meta.num_decodes:
        out[: meta.num_decodes] = _decode(q[: meta.num_decodes], k_cache, v_cache, meta)
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill(q, k, v, k_cache, v_cache, chunk)
    return out


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[..., blocks] ids -> [..., kv_heads, blocks * block_size, head_dim]."""
    gathered = cache[block_ids]  # [..., blocks, block_size, kv_heads, head_dim]
    gathered = gathered.flatten(-4, -3)
    return gathered.transpose(-3, -2)


def _decode(q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
    keys = _gather(k_cache, meta.decode_block_tables)  # [D, kv_heads, L, head_dim]
    values = _gather(v_cache, meta.decode_block_tables)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=meta.decode_mask, enable_gqa=True
    )
    return out.squeeze(2)


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk) -> torch.Tensor:
    query = q[chunk.start : chunk.end].transpose(0, 1)  # [heads, n, head_dim]
    if chunk.mask is None:
        # No cached context: the chunk's own fresh K/V are the whole context.
        keys = k[chunk.start : chunk.end].transpose(0, 1)
        values = v[chunk.start : chunk.end].transpose(0, 1)
        out = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
    else:
        keys = _gather(k_cache, chunk.block_ids)[:, : chunk.context_len]
        values = _gather(v_cache, chunk.block_ids)[:, : chunk.context_len]
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=chunk.mask, enable_gqa=True
        )
    return out.transpose(0, 1)
