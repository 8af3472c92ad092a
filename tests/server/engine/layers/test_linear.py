"""Dense decode-sized layers: every candidate product (PyTorch's linear, the split matmul, the
compiled float32 kernels for one row and for a batch) gives what PyTorch's own linear gives, for
every row count and shape, and the measured choices are among them."""

import sys

import pytest
import torch
import torch.nn.functional as F

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.kernels.operands import ProductKind
from kvpilot_server.engine.layers import linear as module
from kvpilot_server.engine.layers.linear import (
    BATCH_MAX_ROWS,
    DECODE_MAX_ROWS,
    LARGE_PROBE_ROWS,
    SPLIT_MAX_ROWS,
    _candidates,
    _onednn,
    _onednn_serves,
    batch_product,
    decode_product,
    large_product,
    linear,
)
from kvpilot_server.engine.layers.mlp import Linear

# Summation order differs (the kernel adds in 8-wide lanes): float32 rounding, relative to sums
# of hundreds of unit-variance products.
CLOSE = {"rtol": 1e-5, "atol": 1e-4}
# SmolLM2's decode shapes, and odd ones: an input width that is no multiple of 16 exercises the
# kernels' tails, an odd output count the split path's refusal and the batch kernel's output
# tail (its tiles are 3 or 4 outputs wide).
SHAPES = [(960, 576), (576, 1536), (7, 19), (10, 33)]
ROWS = [1, 2, DECODE_MAX_ROWS, DECODE_MAX_ROWS + 1, 40, BATCH_MAX_ROWS, BATCH_MAX_ROWS + 1]
ROWS += [SPLIT_MAX_ROWS + 1, LARGE_PROBE_ROWS + 3]  # a prefill chunk's: large_product()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_equals_pytorch(rows, shape, with_bias):
    generator = torch.Generator().manual_seed(rows * 1000 + shape[0])
    out_features, in_features = shape
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    # Against the exact product: each candidate (MKL, oneDNN, the kernels) rounds its own way,
    # by about sqrt(in_features) float32 steps of the unit-variance terms.
    b = None if bias is None else bias.double()
    expected = F.linear(x.double(), weight.double(), b).float()
    atol = 1e-5 * in_features**0.5
    torch.testing.assert_close(linear(x, weight, bias), expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("name", ["linear", "split", "kernel"])
@pytest.mark.parametrize("rows", [1, 3])
def test_every_candidate_equals_pytorch(name, rows):
    candidates = _candidates()
    assert "kernel" in candidates  # the kernel builds here; otherwise decode loses a candidate
    x, weight, bias = torch.randn(rows, 576), torch.randn(960, 576), torch.randn(960)
    got = candidates[name](x, weight, bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), **CLOSE)


# float32_linear: on AVX-512 up to 4 rows take their own 16-lane loop (masked tails where the
# inputs are no multiple of 16), more rows the 8-lane product; float32_gemm: every tail of its
# row tiles (4 or 6 rows).
COMPILED = [("float32_linear", rows) for rows in range(1, DECODE_MAX_ROWS + 3)]
COMPILED += [("float32_gemm", rows) for rows in range(1, 14)]


@pytest.mark.parametrize("name, rows", COMPILED)
@pytest.mark.parametrize("shape", [(961, 577), (576, 1536), (5, 16), (3, 7)])
def test_the_compiled_products_equal_pytorch(name, rows, shape):
    kernel = cpu_kernels.load()
    assert kernel is not None  # the kernels build here; otherwise decode loses its candidates
    product = getattr(kernel, name)
    generator = torch.Generator().manual_seed(rows * 1000 + shape[0])
    out_features, in_features = shape
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    expected = F.linear(x.double(), weight.double(), bias.double()).float()
    torch.testing.assert_close(product(x, weight, bias), expected, **CLOSE)
    torch.testing.assert_close(product(x, weight, None), expected - bias, **CLOSE)
    transposed = x.t().contiguous().t()  # a strided input is made contiguous, not misread
    torch.testing.assert_close(product(transposed, weight, bias), expected, **CLOSE)


def test_the_measured_choices_are_candidates_and_stay():
    name, product = decode_product()
    assert name in _candidates()
    assert decode_product() == (name, product)  # measured once per process
    assert batch_product()[0] in ("split", "gemm")
    assert batch_product() is batch_product()
    # MKL or oneDNN; the compiled batch product only where it won its own measurement first.
    allowed = ("linear", "onednn", "gemm") if batch_product()[0] == "gemm" else ("linear", "onednn")
    assert large_product()[0] in allowed
    assert large_product() is large_product()
    assert DECODE_MAX_ROWS < BATCH_MAX_ROWS < SPLIT_MAX_ROWS < LARGE_PROBE_ROWS


@pytest.mark.parametrize("strided", [False, True])
def test_onednn_equals_pytorch(strided):
    """oneDNN's linear, a large batch's candidate: here it is (PyTorch's CPU wheels carry it),
    and its products are MKL's to float32 rounding, a strided input and a bias included."""
    assert _onednn_serves()
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(LARGE_PROBE_ROWS + 3, 577, generator=generator)
    x = x.t().contiguous().t() if strided else x
    weight, bias = torch.randn(961, 577, generator=generator), torch.randn(961)
    torch.testing.assert_close(_onednn(x, weight, bias), F.linear(x, weight, bias), **CLOSE)


def test_a_non_contiguous_weight_takes_the_pytorch_path():
    x, weight = torch.randn(2, 64), torch.randn(64, 96)[:, :64]  # a view with a row stride
    assert not weight.is_contiguous()
    torch.testing.assert_close(linear(x, weight, None), F.linear(x, weight, None), **CLOSE)


def test_a_float_layer_names_the_compiled_products_it_runs(monkeypatch):
    """What the decode stack builds a float32 layer from: the weight as stored, and the rows
    linear() would run through the compiled products, by the measured choices."""
    layer = Linear(64, 32, bias=True)
    kernel = cpu_kernels.load()
    measured = {"kernel": kernel.float32_linear, "gemm": kernel.float32_gemm, "split": F.linear}
    measured["linear"] = measured["onednn"] = F.linear
    for small, batch, large, rows in [
        ("kernel", "gemm", "gemm", sys.maxsize),  # every batch: the stack serves any decode
        ("kernel", "gemm", "linear", BATCH_MAX_ROWS),
        ("kernel", "gemm", "onednn", BATCH_MAX_ROWS),
        ("kernel", "split", "linear", 4),
    ]:
        monkeypatch.setattr(module, "decode_product", lambda s=small: (s, measured[s]))
        monkeypatch.setattr(module, "batch_product", lambda b=batch: (b, measured[b]))
        monkeypatch.setattr(module, "large_product", lambda g=large: (g, measured[g]))
        found = layer.decode_operands()
        assert found is not None and found.kind is ProductKind.FLOAT32
        assert found.weight is not None and torch.equal(found.weight, layer.weight)
        assert torch.equal(found.bias, layer.bias) and found.max_rows == rows
    monkeypatch.setattr(module, "decode_product", lambda: ("split", F.linear))
    assert layer.decode_operands() is None  # MKL measured fastest: nothing compiled to call
    monkeypatch.setattr(module, "decode_product", lambda: ("kernel", kernel.float32_linear))
    assert Linear(64, 32, dtype=torch.bfloat16).decode_operands() is None
