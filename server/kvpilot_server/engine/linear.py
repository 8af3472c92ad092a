"""Dense layers for decode-sized batches on CPU.

MKL runs a matrix-vector product (one row) on one core, and handles a few rows as separate
products; either way a 2-core machine reads the weights at about half its memory bandwidth.
Splitting the weight into two halves along its outputs and running them as one batched matmul
puts both cores to work. A single row is doubled first: MKL's one-row batched path is slow.
Large batches are compute-bound, where plain `linear` is as good.
"""

import torch
import torch.nn.functional as F

SPLIT_MAX_ROWS = 256  # measured: faster than `linear` up to here, equal at 512


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows, (out_features, in_features) = x.shape[0], weight.shape
    if rows > SPLIT_MAX_ROWS or out_features % 2 or not x.is_cpu:
        return F.linear(x, weight, bias)
    if rows == 1:
        x = torch.cat((x, x))
    halves = torch.matmul(weight.view(2, out_features // 2, in_features), x.t())
    out = halves.view(out_features, -1).t()[:rows]
    return out if bias is None else out + bias
