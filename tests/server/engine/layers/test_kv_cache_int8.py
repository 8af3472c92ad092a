"""Quantized KV cache: per-token-per-head quantization stays within 1% (int8), the int8 decode
kernel equals the int8 reference path, the reference path equals float attention over the
dequantized cache (int8 and fp8), the engine's two paths agree end to end, int8 holds over 3x
the blocks of float32, and what this machine cannot run fails at start with a clear message
(SmolLM2 with an int8 cache: test_quantization.py)."""

import copy

import pytest
import torch

from kvpilot_common.errors import ConfigError
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
    Workspace,
    paged_attention,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import LayerCache, dequantize, quantize

MiB = 1 << 20
kernel = cpu_kernels.load()
HEADS, KV_HEADS, NUM_BLOCKS = 6, 2, 1200  # three query heads per kv head
# Decodes of these context lengths, then one sequence of 70 tokens prefilling its last 20.
LENS, CHUNK = [1, 2, 17, 64, 100, 3, 150, 70], 20


def _roundtrip(x: torch.Tensor, storage: torch.dtype) -> torch.Tensor:
    return dequantize(*quantize(x, storage), torch.empty_like(x))


@pytest.mark.parametrize(("storage", "bound"), [(torch.int8, 0.01), (torch.float8_e4m3fn, 0.03)])
def test_quantize_roundtrip_error(storage, bound):
    torch.manual_seed(0)
    # Heads of very different magnitudes: per-token-per-head scales must follow each of them.
    x = torch.randn(4096, KV_HEADS, 64) * torch.rand(4096, KV_HEADS, 1) * 20
    q, scale = quantize(x, storage)
    assert q.dtype == storage and scale.shape == x.shape[:-1] and scale.dtype == torch.float32
    back = dequantize(q, scale, torch.empty_like(x))
    assert ((back - x).norm() / x.norm()).item() < bound
    per_head = (back - x).norm(dim=-1) / x.norm(dim=-1)
    assert per_head.max().item() < 2 * bound  # no token or head much worse than the average
    zeros = torch.zeros(3, KV_HEADS, 64)
    assert torch.equal(_roundtrip(zeros, storage), zeros)  # all-zero heads: no 0/0


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("tokens", [1, 5, 300])  # 300: the kernel's parallel loop
def test_kernel_int8_write_is_bit_exact(tokens):
    torch.manual_seed(tokens)
    # Laid out like the engine's keys and values: slices of one fused projection, which
    # decode-sized batches produce transposed (see linear.py).
    fused = torch.randn(3 * KV_HEADS * 64, tokens).t().view(tokens, 3 * KV_HEADS, 64)
    fused[0, KV_HEADS] = 0.0  # an all-zero head
    k, v = fused[:, KV_HEADS : 2 * KV_HEADS], fused[:, 2 * KV_HEADS :]
    slots = torch.randperm(NUM_BLOCKS * 16)[:tokens]
    caches = [_cache(torch.int8, 16, 64) for _ in range(2)]
    caches[1] = copy.deepcopy(caches[0])
    caches[0].write(slots, k, v, None)
    caches[1].write(slots, k, v, kernel)
    for a, b in zip(vars(caches[0]).values(), vars(caches[1]).values(), strict=True):
        assert torch.equal(a, b)


def _cache(storage: torch.dtype, block_size: int, head_dim: int) -> LayerCache:
    shape = (NUM_BLOCKS, block_size, KV_HEADS, head_dim)
    k, v = torch.randn(shape), torch.randn(shape)
    if storage == torch.float32:
        return LayerCache(k, v)
    (qk, k_scale), (qv, v_scale) = quantize(k, storage), quantize(v, storage)
    return LayerCache(qk, qv, k_scale, v_scale)


def _dequantized(cache: LayerCache) -> LayerCache:
    k, v = (torch.empty(cache.k.shape) for _ in range(2))
    return LayerCache(dequantize(cache.k, cache.k_scale, k), dequantize(cache.v, cache.v_scale, v))


def _slots(table: torch.Tensor, positions: list[int], block_size: int) -> list[int]:
    return [int(table[p // block_size]) * block_size + p % block_size for p in positions]


def _step(cache, q, k, v, tables, block_size, window, use_kernel) -> torch.Tensor:
    """One step of LENS: a decode group for all but the last sequence, which prefills CHUNK
    tokens after its cached context (so both read paths gather from the cache)."""
    rows, width = len(LENS) - 1, tables.shape[1]
    lens = torch.tensor(LENS[:rows])
    mask = None if use_kernel else visible_keys(lens - 1, width * block_size, window)[None, :, None]
    group = DecodeGroup(0, rows, tables[:rows].flatten(), width, mask, lens)
    context = LENS[-1]
    positions = list(range(context - CHUNK, context))
    chunk = PrefillChunk(
        start=rows,
        end=rows + CHUNK,
        block_ids=tables[-1, : -(-context // block_size)],
        context_len=context,
        mask=visible_keys(torch.tensor(positions), context, window),
    )
    slots = [s for i, n in enumerate(LENS[:rows]) for s in _slots(tables[i], [n - 1], block_size)]
    slots += _slots(tables[-1], positions, block_size)
    meta = AttentionMetadata(
        torch.tensor(slots), window, kernel if use_kernel else None, [group], [chunk]
    )
    return paged_attention(q, k, v, cache, meta, Workspace())


def _inputs(block_size: int, head_dim: int):
    tokens, width = len(LENS) - 1 + CHUNK, -(-max(LENS) // block_size)
    tables = torch.randperm(NUM_BLOCKS)[: len(LENS) * width].view(len(LENS), width)
    q = torch.randn(tokens, HEADS, head_dim)
    k, v = torch.randn(tokens, KV_HEADS, head_dim), torch.randn(tokens, KV_HEADS, head_dim)
    return q, k, v, tables


WINDOWS = [(1, None), (16, None), (16, 37), (32, 5)]


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("head_dim", [32, 64])  # 64 takes the kernel's compile-time path
@pytest.mark.parametrize(("block_size", "window"), WINDOWS)
def test_int8_kernel_matches_int8_reference(block_size, window, head_dim):
    torch.manual_seed(block_size)
    cache = _cache(torch.int8, block_size, head_dim)
    inputs = _inputs(block_size, head_dim)
    reference = _step(copy.deepcopy(cache), *inputs, block_size, window, use_kernel=False)
    got = _step(cache, *inputs, block_size, window, use_kernel=True)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("storage", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize(("block_size", "window"), WINDOWS)
def test_quantized_reference_is_float_attention_over_the_dequantized_cache(
    storage, block_size, window
):
    torch.manual_seed(block_size)
    cache = _cache(storage, block_size, 64)
    float_cache = _dequantized(cache)
    q, k, v, tables = _inputs(block_size, 64)
    got = _step(cache, q, k, v, tables, block_size, window, use_kernel=False)
    # New tokens are quantized as they are written: the float side gets them pre-rounded.
    k, v = _roundtrip(k, storage), _roundtrip(v, storage)
    want = _step(float_cache, q, k, v, tables, block_size, window, use_kernel=False)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = [
        SamplingParams(max_tokens=5 + 7 * i % 30, temperature=0.0) for i in range(len(prompts))
    ]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.skipif(kernel is None, reason="the CPU kernel did not build on this machine")
@pytest.mark.parametrize("name", ["llama", "mistral-window", "qwen3"])
def test_int8_engine_kernel_and_reference_paths_agree(tiny_dir, corpus_ids, monkeypatch, name):
    """Chunked prefill (chunks after cached context), prefix hits and decodes, end to end."""
    args = {"kv_cache_dtype": "int8", "kv_cache_bytes": 16 * MiB, "max_num_batched_tokens": 40}
    system = corpus_ids[:48]
    prompts = [system + corpus_ids[100 + 37 * i : 100 + 37 * i + 20 * i + 3] for i in range(6)]
    with_kernel = LLM(str(tiny_dir(name)), **args)
    assert with_kernel.engine.runner.kernel is not None
    expected = _generate(with_kernel, prompts)
    monkeypatch.setenv("KVPILOT_CPU_KERNELS", "0")
    reference = LLM(str(tiny_dir(name)), **args)
    assert reference.engine.runner.kernel is None
    assert _generate(reference, prompts) == expected


def test_int8_holds_over_3x_the_blocks_of_float32(tiny_dir):
    path, budget = str(tiny_dir("llama")), 16 * MiB
    float_blocks = LLM(path, kv_cache_bytes=budget).engine.pool.num_blocks
    int8 = LLM(path, kv_cache_bytes=budget, kv_cache_dtype="int8").engine
    # head_dim 16 here: 16 bytes + a 4-byte scale against 64 bytes; SmolLM2 (64) gets 3.8x.
    assert int8.pool.num_blocks >= 3 * float_blocks
    assert sum(layer.nbytes for layer in int8.runner.kv_cache) <= budget


def test_fp8_on_cpu_fails_at_start(tiny_dir):
    with pytest.raises(ConfigError, match=r"fp8 needs a CUDA GPU with compute capability >= 8\.9"):
        LLM(str(tiny_dir("llama")), device="cpu", kv_cache_dtype="fp8", kv_cache_bytes=16 * MiB)


def test_unknown_kv_cache_dtype_fails_at_start(tiny_dir):
    with pytest.raises(ConfigError, match="kv_cache_dtype 'bogus' is not supported"):
        LLM(str(tiny_dir("llama")), kv_cache_dtype="bogus")
