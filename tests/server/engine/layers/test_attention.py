"""The compiled CPU decode kernel agrees with the PyTorch reference path, windows included."""

import pytest
import torch

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
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
def test_kernel_matches_reference(block_size, window, head_dim):
    torch.manual_seed(block_size)
    rows, heads, kv_heads, num_blocks = 7, 6, 2, 1200
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_dim) for _ in range(2)]
    lens = torch.tensor([1, 2, 17, 64, 100, 3, 150])
    width = -(-int(lens.max()) // block_size)
    tables = torch.randperm(num_blocks)[: rows * width].view(rows, width)
    q = torch.randn(rows, heads, head_dim)
    k, v = torch.randn(rows, kv_heads, head_dim), torch.randn(rows, kv_heads, head_dim)
    outs = []
    for use_kernel in (False, True):
        kc, vc = caches[0].clone(), caches[1].clone()
        meta = _decode_meta(tables, lens, block_size, window, use_kernel)
        outs.append(paged_attention(q, k, v, LayerCache(kc, vc), meta, Workspace()))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


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
