"""The compiled prompt attention (kernels/csrc/paged_prefill.cpp) agrees with the PyTorch
reference path: fresh prompts and chunks that continue a cached context, in one step with
decodes, sliding windows, every group size and block size, a layer's own query scale."""

import pytest
import torch

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillBatch,
    PrefillChunk,
    Workspace,
    paged_attention,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import LayerCache

kernel = cpu_kernels.load()
pytestmark = pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build here")

# (tokens already cached, tokens in this step) per sequence; (c, 1) with c > 0 is a decode.
STEP = [(0, 1), (40, 1), (0, 300), (17, 33), (100, 5), (0, 16), (250, 260)]


def _step(scheduled, block_size, window, use_kernel, num_blocks):
    """Metadata as the model runner builds it: decodes first, then the prompt chunks."""
    decodes = [(c, n) for c, n in scheduled if n == 1 and c > 0]
    chunks = [(c, n) for c, n in scheduled if not (n == 1 and c > 0)]
    ordered = decodes + chunks
    width = max(-(-(c + n) // block_size) for c, n in ordered)
    tables = torch.randperm(num_blocks)[: len(ordered) * width].view(len(ordered), width)
    positions = [torch.arange(c, c + n) for c, n in ordered]
    slots = torch.cat(
        [tables[i, p // block_size] * block_size + p % block_size for i, p in enumerate(positions)]
    )
    meta = AttentionMetadata(slots, window, kernel)
    if decodes:
        lens = torch.tensor([c + 1 for c, _ in decodes])
        group_tables = tables[: len(decodes)]
        meta.decodes.append(DecodeGroup(0, len(decodes), group_tables.flatten(), width, None, lens))
    row = len(decodes)
    if use_kernel:
        entries = [(c, n, tables[len(decodes) + i].tolist()) for i, (c, n) in enumerate(chunks)]
        meta.prefill_batch = PrefillBatch.of(row, entries, block_size)
        return meta
    for i, (c, n) in enumerate(chunks):
        fresh = c == 0 and (window is None or window >= n)
        mask = None if fresh else visible_keys(torch.arange(c, c + n), c + n, window)
        blocks = tables[len(decodes) + i, : -(-(c + n) // block_size)]
        meta.prefills.append(PrefillChunk(row, row + n, blocks, c + n, mask))
        row += n
    return meta


def _against_reference(scheduled, block_size, window, head_dim, heads, kv_heads, scale=None):
    torch.manual_seed(block_size * 7 + heads + head_dim)
    num_blocks = len(scheduled) * max(-(-(c + n) // block_size) for c, n in scheduled) + 8
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_dim) for _ in range(2)]
    rows = sum(n for _, n in scheduled)
    # q, k and v as views of one fused projection, as the model hands them over.
    qkv = torch.randn(rows, heads + 2 * kv_heads, head_dim)
    q, k, v = qkv.split_with_sizes((heads, kv_heads, kv_heads), dim=1)
    outs = []
    for use_kernel in (False, True):
        torch.manual_seed(1)  # the same block tables both times
        meta = _step(scheduled, block_size, window, use_kernel, num_blocks)
        cache = LayerCache(caches[0].clone(), caches[1].clone())
        outs.append(paged_attention(q, k, v, cache, meta, Workspace(), scale))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("block_size", "window"), [(1, None), (16, None), (16, 37), (32, 5)])
@pytest.mark.parametrize("head_dim", [24, 64, 128])
@pytest.mark.parametrize("scale", [None, 0.3])  # None: head_dim ** -0.5 (Gemma has its own)
def test_kernel_matches_reference(block_size, window, head_dim, scale):
    _against_reference(STEP, block_size, window, head_dim, 6, 2, scale)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 7])  # query heads per kv head: 3 a pass, then 2, 1
@pytest.mark.parametrize("window", [None, 100])
def test_kernel_matches_reference_for_every_group_size(group, window):
    _against_reference(STEP, 16, window, 64, 2 * group, 2)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_long_chunk_over_a_long_context(threads):
    """Keys in several online-softmax blocks, some queries' maxima rising block after block."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _against_reference([(700, 400), (0, 3)], 16, None, 64, 9, 3)
    finally:
        torch.set_num_threads(before)


def test_a_chunk_outside_its_block_table_is_refused():
    q = torch.randn(4, 2, 64)
    cache = torch.zeros(3, 16, 1, 64)
    args = torch.tensor([[0]]), torch.tensor([0]), torch.tensor([4]), torch.tensor([20])
    with pytest.raises(RuntimeError, match="outside q or its block table"):
        kernel.paged_prefill(q, cache, cache, *args, 0.125, 0, torch.empty(4, 2, 64))
