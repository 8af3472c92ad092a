"""The compiled CPU decode kernel agrees with the PyTorch reference path, windows and a layer's
own query scale included; softcapped attention (Gemma 2) and attention with sinks (gpt-oss)
equal transformers' eager arithmetic."""

import pytest
import torch

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
    Workspace,
    paged_attention,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import LayerCache

kernel = cpu_kernels.load()


def _decode_meta(block_tables, lens, block_size, window, use_kernel) -> AttentionMetadata:
    rows, blocks = block_tables.shape
    mask = (
        None if use_kernel else visible_keys(lens - 1, blocks * block_size, window)[None, :, None]
    )
    group = DecodeGroup(0, rows, block_tables.flatten(), blocks, mask, lens)
    slots = torch.stack(
        [
            block_tables[i, (n - 1) // block_size] * block_size + (n - 1) % block_size
            for i, n in enumerate(lens.tolist())
        ]
    )
    return AttentionMetadata(slots, window, kernel if use_kernel else None, decodes=[group])


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("head_dim", [24, 64, 128])  # 64, 128: compile-time paths
@pytest.mark.parametrize(("block_size", "window"), [(1, None), (16, None), (16, 37), (32, 5)])
@pytest.mark.parametrize("scale", [None, 0.3])  # None: head_dim ** -0.5 (Gemma has its own)
def test_kernel_matches_reference(block_size, window, head_dim, scale):
    _kernel_against_reference(block_size, window, head_dim, scale, heads=6, kv_heads=2)


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("head_dim", [48, 64, 128])  # multiples of 16: AVX-512's grouped pass
@pytest.mark.parametrize("group", [1, 4, 5, 7])  # up to 4 heads a pass: 5 and 7 take two
@pytest.mark.parametrize("window", [None, 37])
def test_kernel_matches_reference_for_every_group_size(head_dim, group, window):
    _kernel_against_reference(16, window, head_dim, None, heads=2 * group, kv_heads=2)


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("threads", [2, 8])  # a few rows' keys split in 2 to 7 parts
@pytest.mark.parametrize("lens", [[1000], [1000, 3], [700, 260]])  # [1000, 3]: empty parts
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("head_dim", [24, 64])  # 24: the per-head path, 64: grouped on AVX-512
def test_kernel_splits_a_few_long_rows_and_merges_them_as_one(threads, lens, window, head_dim):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _kernel_against_reference(16, window, head_dim, None, 6, 2, lens)
    finally:
        torch.set_num_threads(before)


def _kernel_against_reference(block_size, window, head_dim, scale, heads, kv_heads, lens=None):
    torch.manual_seed(block_size + heads)
    lens = torch.tensor(lens or [1, 2, 17, 64, 100, 3, 150])
    rows, num_blocks = len(lens), 1200
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_dim) for _ in range(2)]
    width = -(-int(lens.max()) // block_size)
    tables = torch.randperm(num_blocks)[: rows * width].view(rows, width)
    q = torch.randn(rows, heads, head_dim)
    k, v = torch.randn(rows, kv_heads, head_dim), torch.randn(rows, kv_heads, head_dim)
    outs = []
    for use_kernel in (False, True):
        kc, vc = caches[0].clone(), caches[1].clone()
        meta = _decode_meta(tables, lens, block_size, window, use_kernel)
        outs.append(paged_attention(q, k, v, LayerCache(kc, vc), meta, Workspace(), scale))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def _eager(q, keys, values, mask, scale: float, cap: float | None, sinks) -> torch.Tensor:
    """transformers' eager attention for one sequence: keys repeated per query head (repeat_kv),
    scaled product, tanh(x / cap) * cap where capped (Gemma 2's), the mask added as the dtype's
    minimum; then softmax in float32, or with sinks (gpt-oss's) each head's sink logit appended,
    each row's maximum subtracted, softmax, the sink's column dropped. q [n, heads, d], keys
    [L, kv_heads, d], mask [n, L], sinks [heads]."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    logits = torch.matmul(q.transpose(0, 1), k.transpose(1, 2)) * scale
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    logits = logits + torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    if sinks is None:
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        combined = torch.cat((logits, sinks.view(-1, 1, 1).expand(-1, len(q), 1)), dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = torch.softmax(combined, dim=-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(weights, v).transpose(0, 1)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize(("cap", "with_sinks"), [(2.0, False), (None, True), (2.0, True)])
def test_eager_attention_matches_transformers(window, cap, with_sinks):
    """Capped logits (Gemma 2) and attention sinks (gpt-oss), each and both. One sequence of 30
    tokens in 4-token blocks: a fresh prefill of 20, a chunk of 9 over them, then a decode; each
    equals the eager computation over the whole sequence."""
    torch.manual_seed(3)
    block_size, heads, kv_heads, d, scale, length = 4, 6, 2, 16, 0.3, 30
    q, k, v = (torch.randn(length, h, d) * 2 for h in (heads, kv_heads, kv_heads))
    # Sinks about the logits' size, each head its own: a sink misplaced or left out shows.
    sinks = torch.randn(heads) * 3 if with_sinks else None
    blocks = torch.randperm(12)[: -(-length // block_size)]
    positions = torch.arange(length)
    slots = blocks[positions // block_size] * block_size + positions % block_size
    expected = _eager(q, k, v, visible_keys(positions, length, window), scale, cap, sinks)
    cache = LayerCache(*(torch.zeros(12, block_size, kv_heads, d) for _ in range(2)))

    def run(start: int, end: int, meta: AttentionMetadata) -> None:
        meta.slot_mapping = slots[start:end]
        qkv = q[start:end], k[start:end], v[start:end]
        out = paged_attention(*qkv, cache, meta, Workspace(), scale, cap, sinks)
        torch.testing.assert_close(out, expected[start:end], atol=1e-5, rtol=1e-5)

    fresh = None if window is None else visible_keys(positions[:20], 20, window)
    run(0, 20, AttentionMetadata(slots, window, prefills=[PrefillChunk(0, 20, blocks, 20, fresh)]))
    chunk = PrefillChunk(0, 9, blocks, 29, visible_keys(positions[20:29], 29, window))
    run(20, 29, AttentionMetadata(slots, window, prefills=[chunk]))
    mask = visible_keys(positions[29:], len(blocks) * block_size, window)[None, :, None]
    group = DecodeGroup(0, 1, blocks, len(blocks), mask, torch.tensor([length]))
    run(29, 30, AttentionMetadata(slots, window, decodes=[group]))


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
def test_kernel_write_puts_keys_and_values_where_index_copy_does():
    torch.manual_seed(0)
    k_cache, v_cache = torch.zeros(10, 4, 2, 64), torch.zeros(10, 4, 2, 64)
    slots = torch.tensor([39, 0, 17, 5])
    # Decode-sized projections come out transposed (linear.py): no unit stride.
    k = torch.randn(2 * 64, 4).t().view(4, 2, 64)
    v = torch.randn(4, 2, 64)
    kernel.write_kv(k, v, k_cache, v_cache, slots)
    for cache, new in ((k_cache, k), (v_cache, v)):
        expected = torch.zeros(40, 2, 64).index_copy_(0, slots, new)
        assert torch.equal(cache.flatten(0, 1), expected)
    with pytest.raises(RuntimeError, match="slot out of range"):
        kernel.write_kv(k, v, k_cache, v_cache, torch.tensor([0, 1, 2, 40]))


def test_the_kernel_builds_on_this_machine():
    # The tests above skip without it; this one says so (a build error once hid that way).
    assert kernel is not None
