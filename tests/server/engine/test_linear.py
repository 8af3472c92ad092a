"""Dense decode-sized layers: the compiled float32 kernel and the split matmul give what
PyTorch's own linear gives, for every row count and shape the routing sends them."""

import pytest
import torch
import torch.nn.functional as F

from kvpilot_server.engine import cpu_kernels
from kvpilot_server.engine.linear import DENSE_KERNEL_MAX_ROWS, SPLIT_MAX_ROWS, linear

# Summation order differs (the kernel adds in 8-wide lanes): float32 rounding, relative to sums
# of hundreds of unit-variance products.
CLOSE = {"rtol": 1e-5, "atol": 1e-4}
# SmolLM2's decode shapes, and odd ones: an input width that is no multiple of 16 exercises the
# kernel's tail, an odd output count the split path's refusal.
SHAPES = [(960, 576), (576, 1536), (7, 19), (10, 33)]


@pytest.mark.parametrize("rows", [1, 2, DENSE_KERNEL_MAX_ROWS, DENSE_KERNEL_MAX_ROWS + 1, 40])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_equals_pytorch(rows, shape, with_bias):
    generator = torch.Generator().manual_seed(rows * 1000 + shape[0])
    out_features, in_features = shape
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias), **CLOSE)


def test_the_float32_kernel_is_what_decode_uses_here():
    kernel = cpu_kernels.load_weight_only()
    assert kernel is not None  # otherwise every decode step reads weights at MKL's one-core pace
    x, weight = torch.randn(1, 576), torch.randn(960, 576)
    torch.testing.assert_close(kernel.float32_linear(x, weight, None), x @ weight.t(), **CLOSE)
    assert DENSE_KERNEL_MAX_ROWS < SPLIT_MAX_ROWS


def test_a_non_contiguous_weight_takes_the_pytorch_path():
    x, weight = torch.randn(2, 64), torch.randn(64, 96)[:, :64]  # a view with a row stride
    assert not weight.is_contiguous()
    torch.testing.assert_close(linear(x, weight, None), F.linear(x, weight, None), **CLOSE)
