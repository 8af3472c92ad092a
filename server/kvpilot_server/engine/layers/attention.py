"""Paged attention, the reference path (on CUDA, flash_attention.py's serves where it can).

New K/V are written into their cache slots first; each query then attends to its sequence's
keys gathered through the block table. Decodes (one query each) run in a few padded groups of
similar context length; prefill chunks run one sequence at a time so a long chunk never pads a
batch of decodes. Masks are explicit: SDPA's `is_causal` aligns the top-left corner, which is
wrong whenever the query is a later chunk of a longer context. On CPU with a float32 cache the
compiled kernels serve instead: decodes through `kernel.paged_decode`, and every prompt chunk
of the step in one `kernel.paged_prefill` call (PrefillBatch), in place in the cache.

Gathers write into a reusable workspace: a fresh tensor of tens of MB per layer would be
mmapped and page-faulted on every call, which costs more than the copy itself. A quantized
cache (kv_cache.py) is gathered as bytes with its scales and dequantized there before SDPA.

A layer may give its own query scale (Gemma: query_pre_attn_scalar ** -0.5, not head_dim ** -0.5),
a logit softcap (Gemma 2: tanh(logits / cap) * cap before the softmax) and attention sinks
(gpt-oss: a learned logit per head that joins each query's softmax, taking probability mass and
adding no value). SDPA has no step between its product and its softmax, so such layers take
`_eager`, transformers' eager arithmetic; the compiled decode kernel has none either, and the
model runner leaves it off for such models.
"""

from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F

from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.layers.flash_attention import FlashBatch
from kvpilot_server.engine.layers.kv_cache import LayerCache, dequantize, raw_bytes


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
class PrefillBatch:
    """Every prompt chunk of a step as the compiled prefill kernel reads them
    (kernels/csrc/paged_prefill.cpp): in place in the cache through each block table, so no
    chunk needs a gather or a mask."""

    tables: torch.Tensor  # [chunks, width] block ids, padded (the padding is never read)
    rows: torch.Tensor  # [chunks] each chunk's first row of the flattened batch
    lens: torch.Tensor  # [chunks] its query tokens
    contexts: torch.Tensor  # [chunks] keys its last token sees: cached context plus chunk

    @staticmethod
    def of(row: int, chunks: list[tuple[int, int, list[int]]], block_size: int) -> "PrefillBatch":
        """chunks: (tokens already cached, tokens in this step, block table) each, in row
        order from `row`."""
        contexts = [computed + n for computed, n, _ in chunks]
        width = max(-(-context // block_size) for context in contexts)
        tables = [table[:width] + [0] * (width - len(table[:width])) for _, _, table in chunks]
        lens = [n for _, n, _ in chunks]
        rows = [row + sum(lens[:i]) for i in range(len(lens))]
        return PrefillBatch(*(torch.tensor(x) for x in (tables, rows, lens, contexts)))


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [N] cache slot of each new token
    window: int | None = None  # sliding window of the layers this metadata serves
    kernel: ModuleType | None = None  # compiled CPU decode kernel, when available
    decodes: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    # Where the compiled kernel serves the step's prompt chunks (a float32 cache on CPU), they
    # are here instead of in `prefills`.
    prefill_batch: PrefillBatch | None = None
    # Set on CUDA where the flash path serves (flash_attention.py): then it is all there is.
    flash: FlashBatch | None = None


class Workspace:
    """Grow-only scratch buffers for gathered keys and values, one per use (see `_gather`)."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}

    def view(
        self, which: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        numel = 1
        for dim in shape:
            numel *= dim
        buf = self.buffers.get(which)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = self.buffers[which] = torch.empty(numel, dtype=dtype, device=device)
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
    cache: LayerCache,
    meta: AttentionMetadata,
    workspace: Workspace,
    # None: SDPA's own default, head_dim ** -0.5 (left to SDPA, so the families without a scale
    # of their own keep exactly its arithmetic)
    scale: float | None = None,
    softcap: float | None = None,  # None: logits uncapped
    sinks: torch.Tensor | None = None,  # [heads] one more logit per head; None: no sinks
) -> torch.Tensor:
    cache.write(meta.slot_mapping, k, v, meta.kernel)
    if meta.flash is not None:
        return flash_attention.attend(q, cache, meta.flash, meta.window, scale)
    extra = softcap, sinks
    batch = meta.prefill_batch
    if len(meta.decodes) == 1 and not meta.prefills and batch is None:  # a pure-decode step
        return _decode(q, cache, meta, meta.decodes[0], workspace, scale, *extra)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for group in meta.decodes:
        rows = slice(group.start, group.end)
        out[rows] = _decode(q[rows], cache, meta, group, workspace, scale, *extra)
    if batch is not None:
        assert meta.kernel is not None and softcap is None and sinks is None
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        window = meta.window or 0
        meta.kernel.paged_prefill(
            q, cache.k, cache.v, batch.tables, batch.rows, batch.lens, batch.contexts, scale,
            window, out
        )  # fmt: skip
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill(q, k, v, cache, chunk, workspace, scale, *extra)
    return out


def _eager(query, keys, values, mask: torch.Tensor, scale, cap, sinks) -> torch.Tensor:
    """Attention in transformers' eager order: scaled product, tanh(x / cap) * cap where capped,
    mask, the sink logits appended where given (`sinks` broadcast to [..., n, 1]), softmax in
    float32, the sinks' column dropped. query [..., n, head_dim] against keys and values
    [..., L, head_dim] (batch dims broadcast), mask [..., n, L] bool, True where visible.
    transformers' gpt-oss also subtracts each row's maximum first: softmax itself does exactly
    that, so the probabilities are the same floats."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(query, keys.transpose(-1, -2)) * scale
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    logits = logits.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        sinks = sinks.to(logits.dtype).expand(*logits.shape[:-1], 1)
        combined = torch.cat((logits, sinks), dim=-1)
        weights = torch.softmax(combined, dim=-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(weights.to(query.dtype), values)


def _gather(
    cache: LayerCache, block_ids: torch.Tensor, workspace: Workspace, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V blocks in block-id order, [len(ids), block_size, kv_heads, head_dim] at `dtype`;
    quantized blocks are gathered as bytes with their scales, then dequantized."""
    shape, device = (block_ids.numel(), *cache.k.shape[1:]), cache.k.device
    out = []  # workspace buffers: 0/1 K/V at `dtype`, 2/3 their raw bytes, 4/5 their scales
    for which, (values, scales) in enumerate(((cache.k, cache.k_scale), (cache.v, cache.v_scale))):
        dest = workspace.view(which, shape, dtype, device)
        if scales is None:
            out.append(torch.index_select(values, 0, block_ids, out=dest))
            continue
        raw = workspace.view(2 + which, shape, torch.uint8, device)
        torch.index_select(raw_bytes(values), 0, block_ids, out=raw)
        scale = workspace.view(4 + which, shape[:-1], scales.dtype, device)
        torch.index_select(scales, 0, block_ids, out=scale)
        out.append(dequantize(raw.view(values.dtype), scale, dest))
    return out[0], out[1]


def _decode(q, cache: LayerCache, meta, group: DecodeGroup, workspace, scale, softcap, sinks):
    rows, (_, block_size, kv_heads, head_dim) = group.end - group.start, cache.k.shape
    if meta.kernel is not None:
        assert softcap is None and sinks is None, "the decode kernel has no cap and no sinks"
        q, tables = q.contiguous(), group.block_ids.view(rows, group.blocks)
        scale = head_dim**-0.5 if scale is None else scale
        lens, window = group.context_lens, meta.window or 0
        if cache.k_scale is None:
            return meta.kernel.paged_decode(q, cache.k, cache.v, tables, lens, scale, window)
        return meta.kernel.paged_decode_int8(
            q, cache.k, cache.v, cache.k_scale, cache.v_scale, tables, lens, scale, window
        )
    context = rows, group.blocks * block_size, kv_heads, head_dim
    keys, values = _gather(cache, group.block_ids, workspace, q.dtype)
    # [kv_heads, rows, L, head_dim]: sequences play SDPA's "heads" and each kv head's query
    # group plays its "queries", so grouped-query attention needs no repeated keys.
    keys = keys.view(context).permute(2, 0, 1, 3)
    values = values.view(context).permute(2, 0, 1, 3)
    queries = q.view(rows, kv_heads, -1, head_dim).transpose(0, 1)
    if softcap is not None or sinks is not None:
        # Each query head's sink on its own row of its kv head's group: [kv_heads, 1, group, 1].
        sinks = None if sinks is None else sinks.view(kv_heads, 1, -1, 1)
        out = _eager(queries, keys, values, group.mask, scale, softcap, sinks)
    else:
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=group.mask, scale=scale
        )
    return out.transpose(0, 1).reshape(rows, -1, head_dim)


def _prefill(q, k, v, cache: LayerCache, chunk: PrefillChunk, workspace, scale, softcap, sinks):
    # 4-D inputs ([1, heads, n, head_dim]): with 3-D ones PyTorch's CPU SDPA takes its slow
    # math path (measured 4x slower for a 300-token prompt).
    query = q[chunk.start : chunk.end].transpose(0, 1)[None]
    if chunk.mask is None:
        # No cached context: the chunk's own fresh K/V are the whole context (unquantized,
        # as in vLLM: quantization only touches what is read back from the cache).
        keys = k[chunk.start : chunk.end].transpose(0, 1)[None]
        values = v[chunk.start : chunk.end].transpose(0, 1)[None]
    else:
        keys, values = _gather(cache, chunk.block_ids, workspace, q.dtype)
        keys = keys.flatten(0, 1)[: chunk.context_len].transpose(0, 1)[None]
        values = values.flatten(0, 1)[: chunk.context_len].transpose(0, 1)[None]
    if softcap is not None or sinks is not None:
        n, kv_heads = chunk.end - chunk.start, keys.shape[1]
        mask = chunk.mask
        if mask is None:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        # [kv_heads, group, n, head_dim] against [kv_heads, 1, L, head_dim]: each kv head serves
        # its group of consecutive query heads (transformers' repeat_kv), without repeating it.
        grouped = query.reshape(kv_heads, -1, n, query.shape[-1])
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)
        sinks = None if sinks is None else sinks.view(kv_heads, -1, 1, 1)
        out = _eager(grouped, keys, values, mask, scale, softcap, sinks)
        return out.view(query.shape)[0].transpose(0, 1)
    causal = chunk.mask is None
    out = F.scaled_dot_product_attention(
        query,
        keys,
        values,
        attn_mask=chunk.mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
