"""What a quantized linear layer hands the compiled kernels: which product it runs and the
tensors it runs it on.

The layers (layers/quant.py) say this through decode_operands(), so that a kernel caller (the
decode stack, kernels/decode_stack.py) needs neither their buffer table nor their kernel
functions' names: a layer that changes how it stores its weights changes what it returns, and
the callers follow.
"""

import enum
from typing import NamedTuple

import torch


class ProductKind(enum.Enum):
    """A compiled product; the value is the kind csrc's stack_linear takes."""

    INT8 = "int8"  # int8 weights against float activations (csrc/weight_only.cpp)
    INT4 = "int4"  # int4 weights against float activations (csrc/weight_only.cpp)
    # int4 weights against activations quantized to int8 per block (csrc/int8_activations.cpp)
    INT4_INT8 = "int4_int8"


class DecodeOperands(NamedTuple):
    """One layer's arguments to its product, in csrc's order."""

    kind: ProductKind
    weight: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None  # int4's per-group minimum; None for int8
    group: int  # int4's group size; 0 for int8
    bias: torch.Tensor | None
