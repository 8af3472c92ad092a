"""The compiled small ops of a decode layer against PyTorch's own: the rotation bit for bit
(same float operations, no contracted multiply-adds), the norms and silu to float32 rounding,
the residual add exactly."""

import pytest
import torch
import torch.nn.functional as F

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.models import llama

ops = cpu_kernels.load()


def _reference_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def test_the_layer_ops_build_on_this_machine():
    assert ops is not None  # otherwise every decode layer runs a dozen more PyTorch ops


@pytest.mark.parametrize("rows", [1, 7, 100])
def test_rotation_equals_pytorch_bit_for_bit_whatever_the_strides(rows):
    torch.manual_seed(0)
    cos, sin = torch.randn(rows, 1, 64), torch.randn(rows, 1, 64)
    qkv = torch.randn(rows, 15, 64)
    qk = qkv.split((12, 3), dim=1)[0]  # a view: rows further apart than its heads
    transposed = torch.randn(15 * 64, rows).t().view(rows, 15, 64)  # no unit stride at all
    for x in (qk, transposed, qk.contiguous()):
        assert torch.equal(ops.rotate(x, cos, sin), _reference_rotate(x, cos, sin))


@pytest.mark.parametrize("rows", [1, 3, 130])
def test_norms_match_pytorch_and_the_residual_add_is_exact(rows):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(rows, 576), torch.randn(rows, 576) * 4, torch.randn(576)
    expected_sum = residual + x
    expected = F.rms_norm(expected_sum, (576,), weight, 1e-5)
    assert torch.allclose(ops.rms_norm(expected_sum, weight, 1e-5), expected, rtol=1e-5, atol=1e-6)
    out = ops.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(residual, expected_sum)  # in place: the stream the next layer adds to
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_the_model_norm_gives_the_same_answer_without_the_kernels(monkeypatch):
    torch.manual_seed(0)
    norm = llama.RMSNorm(576, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576))
    x, residual = torch.randn(5, 576), torch.randn(5, 576)
    fast, fast_residual = norm(x, residual.clone())
    monkeypatch.setattr(llama, "layer_ops", lambda x: None)
    slow, slow_residual = norm(x, residual.clone())
    assert torch.equal(fast_residual, slow_residual)
    assert torch.allclose(fast, slow, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 40])
def test_silu_mul_matches_pytorch_to_the_last_bits(rows):
    # x / (1 + e^-x) as PyTorch defines silu; its vectorised exp may round the last bit apart.
    torch.manual_seed(0)
    gate_up = torch.randn(rows, 2 * 1536) * 4
    gate, up = gate_up.split(1536, dim=-1)
    expected = F.silu(gate) * up
    torch.testing.assert_close(ops.silu_mul(gate_up), expected, rtol=2e-6, atol=1e-6)
    padded = torch.randn(rows, 2 * 1536 + 8)[:, : 2 * 1536]  # rows further apart than wide
    gate, up = padded.split(1536, dim=-1)
    torch.testing.assert_close(ops.silu_mul(padded), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


def test_silu_mul_keeps_large_gates_finite():
    # e^-x of a large negative gate is past float's range: the quotient goes to -0, not NaN.
    # 11 gates: one vector of 8 and a tail of 3, each path seeing both signs.
    gate = torch.tensor([-1000.0, -100.0, -88.5, -20.0, 0.0, 20.0, 88.5, 100.0, 1000.0, -95, 95])
    gate_up = torch.cat((gate, torch.full_like(gate, 3.0)))[None]
    torch.testing.assert_close(ops.silu_mul(gate_up)[0], F.silu(gate) * 3.0)
