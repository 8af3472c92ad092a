"""Dense layers for decode-sized batches on CPU.

MKL runs a matrix-vector product (one row) on one core, and handles a few rows as separate
products; either way a 2-core machine reads the weights at about half its memory bandwidth.
For float32 and up to DENSE_KERNEL_MAX_ROWS rows, the compiled kernel (csrc/weight_only.cpp)
splits output rows across every core and reads each weight row once for all the input rows.
Without it (disabled, no compiler), splitting the weight into two halves along its outputs and
running them as one batched matmul puts both cores to work; a single row is doubled first: MKL's
one-row batched path is slow. Large batches are compute-bound, where plain `linear` is as good.
"""

import torch
import torch.nn.functional as F

from kvpilot_server.engine import cpu_kernels

SPLIT_MAX_ROWS = 256  # measured: faster than `linear` up to here, equal at 512
# Measured over SmolLM2's 121 decode matrices (weights cold, as in a step): the kernel takes
# half MKL's time at one row and still wins at four; by sixteen MKL's blocking wins.
DENSE_KERNEL_MAX_ROWS = 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows, (out_features, in_features) = x.shape[0], weight.shape
    if not x.is_cpu:
        return F.linear(x, weight, bias)
    if rows <= DENSE_KERNEL_MAX_ROWS and x.dtype == weight.dtype == torch.float32:
        kernel = cpu_kernels.load_weight_only()
        if kernel is not None and weight.is_contiguous():
            return kernel.float32_linear(x, weight, bias)
    if rows > SPLIT_MAX_ROWS or out_features % 2:
        return F.linear(x, weight, bias)
    if rows == 1:
        x = torch.cat((x, x))
    halves = torch.matmul(weight.view(2, out_features // 2, in_features), x.t())
    out = halves.view(out_features, -1).t()[:rows]
    return out if bias is None else out + bias
