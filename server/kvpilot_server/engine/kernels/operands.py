"""What a linear layer hands the compiled kernels: which product it runs, on which tensors, for
how many rows.

The layers (layers/quant.py's int8 and int4, layers/mlp.py's float Linear,
layers/half_matrices.py's bfloat16 one) say this through
decode_operands(), so that a kernel caller (the decode stack, kernels/decode_stack.py) needs
neither their buffer table, their kernel functions' names nor their measured choices: a layer
that changes how it stores its weights changes what it returns, and the callers follow.
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
    # float32 weights as stored: csrc/weight_only.cpp's float32_linear for a few rows, then
    # csrc/float32_gemm.cpp's register tiles (layers/linear.py measures both against MKL)
    FLOAT32 = "float32"
    # bfloat16 weights in oneDNN's packed layout, the input rounded to bfloat16 on its way in
    # (layers/half_matrices.py): oneDNN's product, called from C++
    BFLOAT16 = "bfloat16"


class DecodeOperands(NamedTuple):
    """One layer's arguments to its product, in csrc's order."""

    kind: ProductKind
    weight: torch.Tensor
    scale: torch.Tensor | None  # None for float32 and bfloat16
    minimum: torch.Tensor | None  # int4's per-group minimum; None for the others
    group: int  # int4's group size; 0 for the others
    bias: torch.Tensor | None
    max_rows: int  # rows up to which this product serves the layer; beyond, its module does
