"""Dense decode-sized layers: every candidate product (PyTorch's linear, the split matmul, the
compiled float32 kernel) gives what PyTorch's own linear gives, for every row count and shape,
and the measured choice is one of them."""

import pytest
import torch
import torch.nn.functional as F

from kvpilot_server.engine.layers.linear import (
    DECODE_MAX_ROWS,
    SPLIT_MAX_ROWS,
    _candidates,
    decode_product,
    linear,
)

# Summation order differs (the kernel adds in 8-wide lanes): float32 rounding, relative to sums
# of hundreds of unit-variance products.
CLOSE = {"rtol": 1e-5, "atol": 1e-4}
# SmolLM2's decode shapes, and odd ones: an input width that is no multiple of 16 exercises the
# kernel's tail, an odd output count the split path's refusal.
SHAPES = [(960, 576), (576, 1536), (7, 19), (10, 33)]


@pytest.mark.parametrize("rows", [1, 2, DECODE_MAX_ROWS, DECODE_MAX_ROWS + 1, 40])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_equals_pytorch(rows, shape, with_bias):
    generator = torch.Generator().manual_seed(rows * 1000 + shape[0])
    out_features, in_features = shape
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias), **CLOSE)


@pytest.mark.parametrize("name", ["linear", "split", "kernel"])
@pytest.mark.parametrize("rows", [1, 3])
def test_every_candidate_equals_pytorch(name, rows):
    candidates = _candidates()
    assert "kernel" in candidates  # the kernel builds here; otherwise decode loses a candidate
    x, weight, bias = torch.randn(rows, 576), torch.randn(960, 576), torch.randn(960)
    got = candidates[name](x, weight, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), **CLOSE)


def test_the_measured_choice_is_a_candidate_and_stays():
    name, product = decode_product()
    assert name in _candidates()
    assert decode_product() == (name, product)  # measured once per process
    assert DECODE_MAX_ROWS < SPLIT_MAX_ROWS


def test_a_non_contiguous_weight_takes_the_pytorch_path():
    x, weight = torch.randn(2, 64), torch.randn(64, 96)[:, :64]  # a view with a row stride
    assert not weight.is_contiguous()
    torch.testing.assert_close(linear(x, weight, None), F.linear(x, weight, None), **CLOSE)
