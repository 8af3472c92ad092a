"""The gated MLP every family shares (SwiGLU: silu(gate) * up, then down; Gemma's gate takes the
tanh-approximated gelu instead; gpt-oss's experts a clamped SwiGLU), and the module form of
layers/linear.py's product. gate and up are fused into one matmul (one larger GEMM). Under
tensor parallelism each rank holds a slice of the intermediate columns and down_proj ends in one
all-reduce; an expert (layers/moe.py) returns its partial sum and the block reduces once."""

import functools
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.kernels.operands import DecodeOperands, ProductKind
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.linear import compiled_max_rows, linear

# The gate's activation by the config's name (hidden_act; Gemma's hidden_activation), as
# transformers' ACT2FN computes each.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float):
    """gpt-oss's gated unit (transformers' GptOssExperts._apply_gate, in its order): gate capped
    above and up on both sides at `limit`, then gate * sigmoid(alpha * gate) * (up + 1). Not of
    the act(gate) * up form of ACTIVATIONS, hence its own branch in MLP."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


@functools.cache
def _compiled_layer_ops() -> ModuleType | None:
    return cpu_kernels.load()  # looked up once: reading the environment costs µs


def layer_ops(x: torch.Tensor) -> ModuleType | None:
    """The compiled small ops, for float32 on CPU (None elsewhere: PyTorch's ops serve)."""
    return _compiled_layer_ops() if x.is_cpu and x.dtype == torch.float32 else None


class Linear(Direct, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def decode_operands(self) -> DecodeOperands | None:
        """The compiled float32 products linear() runs this layer's decode rows through (the
        decode stack calls them in its place), or None where it runs none: another dtype or
        device, or MKL measured fastest."""
        weight = self.weight
        if not weight.is_cpu or weight.dtype != torch.float32 or not weight.is_contiguous():
            return None
        rows = compiled_max_rows()
        if rows == 0:
            return None
        bias = None if self.bias is None else self.bias.detach()
        return DecodeOperands(ProductKind.FLOAT32, weight.detach(), None, None, 0, bias, rows)


class MLP(Direct):
    def __init__(
        self,
        hidden: int,
        intermediate: int,
        bias: bool,
        tp: TensorParallel,
        act: str = "silu",
        swiglu: tuple[float, float] | None = None,  # (alpha, limit): clamped_swiglu, not act
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ModelLoadError(f"activation {act!r} is not supported: {', '.join(ACTIVATIONS)}")
        self.tp = tp
        self.intermediate = intermediate
        self.act = ACTIVATIONS[act]
        self.swiglu = swiglu
        self.silu = act == "silu" and swiglu is None  # the compiled silu(gate) * up serves it
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias)
        # Row-parallel: the bias is added once, on rank 0 (engine/distributed/sharding.py).
        self.down_proj = Linear(intermediate, hidden, bias=bias and tp.rank == 0)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the all-reduce."""
        gate_up = self.gate_up_proj(x)
        ops = layer_ops(gate_up)
        # The compiled silu(gate) * up: one pass where PyTorch's silu and product make two.
        if ops is not None and self.silu and gate_up.dim() == 2 and gate_up.stride(1) == 1:
            return self.down_proj(ops.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        if self.swiglu is not None:
            return self.down_proj(clamped_swiglu(gate, up, *self.swiglu))
        return self.down_proj(self.act(gate) * up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))

    def linears(self) -> list[tuple[nn.Module, str]]:
        """(owner, attribute) of its linear layers: what quantization replaces."""
        return [(self, "gate_up_proj"), (self, "down_proj")]
