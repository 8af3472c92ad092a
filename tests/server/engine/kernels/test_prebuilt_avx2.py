"""The image's prebuilt CPU kernels for CPUs without AVX-512 (cpu_kernels.LEVELS' avx2), loaded
as such a CPU would load them, against this CPU's own build."""

import logging
from pathlib import Path

import torch
from torch import nn

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.quant import (
    KERNEL_MAX_ROWS,
    DenseBuffer,
    Int4Linear,
    quantize_int8,
)
from kvpilot_testing.kernel_builds import build_prebuilt


def test_the_prebuilt_avx2_kernels_load_and_give_the_same_answers(monkeypatch, caplog):
    # The image's avx2 level, for CPUs without AVX-512: it multiplies the bytes with maddubs +
    # madd instead of VNNI's dpbusd; the integers are exact either way, so the answers must be
    # identical, not merely close. Built as the image builds it, and loaded as a server on an
    # AVX2-only CPU would load it (that CPU's flags stand in for one this machine may not be).
    native = cpu_kernels.load()  # this CPU's, cached before the environment below is set
    avx2 = next(level for level in cpu_kernels.LEVELS if level.name == "avx2")
    root = build_prebuilt(avx2)  # compiled once per source_key (kernel_builds)
    monkeypatch.setenv(cpu_kernels.PREBUILT_ENV, str(root))
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: avx2.needs)
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        portable = cpu_kernels._load.__wrapped__()
    assert f"CPU kernels: prebuilt for avx2 ({root / 'avx2'})" in caplog.messages
    assert Path(portable.__file__).parent == root / "avx2" != Path(native.__file__).parent
    torch.manual_seed(0)
    linear = nn.Linear(1536, 576)
    int4 = Int4Linear(linear, DenseBuffer(torch.empty(0)), 32)
    int4_args = int4.weight, int4.scale, int4.minimum, 32, int4.bias
    int8_args = *quantize_int8(linear.weight), linear.bias
    assert int4.kernel is native
    for rows in (1, 5, KERNEL_MAX_ROWS):
        x = torch.randn(rows, 1536) * 3
        x[0, :32] = 100.0  # the largest products the int8 path meets: 127 * 127 per pair
        for name, args in (("int4_int8_linear", int4_args), ("int8_int8_linear", int8_args)):
            expected = getattr(native, name)(x, *args)
            assert torch.equal(getattr(portable, name)(x, *args), expected), name
    # The float32 products' AVX2 loops (the batch product's 3 outputs by 4 rows; 8 lanes for
    # few rows) against a float64 reference: their sums run in other lanes than the AVX-512
    # build's, so close, not equal.
    for rows in (1, 4, 5, 7, 43):
        x = torch.randn(rows, 1536)
        expected = nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
        for name in ("float32_linear", "float32_gemm"):
            got = getattr(portable, name)(x, linear.weight.detach(), linear.bias.detach())
            torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-4)
    # Inputs that end mid-line (40 = 16 + 16 + 8): the few-row loop's scalar tail.
    odd, bias = torch.randn(24, 40), torch.randn(24)
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, 40)
        expected = nn.functional.linear(x.double(), odd.double(), bias.double()).float()
        torch.testing.assert_close(portable.float32_linear(x, odd, bias), expected)
    # Decode attention: both builds take up to four query heads of a group in one pass (8 lanes
    # against 16, 2 or 4 keys at a time against 4), one at a time where head_dim is not a
    # multiple of 16; the same sums in other orders. Groups of 4, 3 (SmolLM2's), 7 (a pass of
    # 4, then 3) and 1; head dims 64, 128, and 48 and 40 (one pass, and one head at a time).
    tables = torch.randperm(64)[:30].view(3, 10)
    lens = torch.tensor([1, 77, 160])
    for kv_heads, heads, head_dim in ((2, 8, 64), (3, 9, 64), (1, 7, 128), (2, 2, 48), (1, 3, 40)):
        cache = [torch.randn(64, 16, kv_heads, head_dim) for _ in range(2)]
        q = torch.randn(3, heads, head_dim)
        for window in (0, 37):
            args = (q, *cache, tables, lens, 0.125, window)
            torch.testing.assert_close(portable.paged_decode(*args), native.paged_decode(*args))
