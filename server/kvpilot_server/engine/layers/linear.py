"""Dense layers for decode-sized batches on CPU.

Which product reads a decode step's weights fastest depends on the machine, so the first small
product measures the candidates once per process and keeps the fastest:
- PyTorch's own linear: on some CPUs MKL runs a one-row product on one core and a few rows as
  separate products, reading the weights at about half the memory bandwidth; on others it is
  the best there is;
- the same weight as two halves along its outputs in one batched matmul, which puts both
  cores of a 2-core machine to work (a single row is doubled first: MKL's one-row batched path
  is slow);
- the compiled kernel (kernels/csrc/weight_only.cpp): output rows split across every core, each
  weight row read once for all the input rows.
A decode batch (a few dozen rows) is compute-bound, but at such row counts MKL runs well under
the machine's peak; the compiled register-tile product (kernels/csrc/float32_gemm.cpp) is
measured against the split one the same way, at a batch's size, and the faster serves. For
larger batches (prefill chunks) MKL, oneDNN's float32 GEMM (part of PyTorch: its JIT kernels
dispatch on the CPU's instruction sets, MKL's fast paths partly on its vendor) and the
register-tile product where it won the batch measurement are measured once at a prefill
chunk's size, and the winner serves every larger batch.
"""

import functools
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvpilot_server.engine import huge_pages
from kvpilot_server.engine.kernels import cpu_kernels

SPLIT_MAX_ROWS = 256  # measured: faster than `linear` up to here, equal at 512
# Rows up to which the measured choice applies; beyond, MKL's blocking wins (measured at 16).
DECODE_MAX_ROWS = 4
# Rows up to which the measured choice of batch_product() applies (measured: above 64 MKL is as
# fast or faster, at multiples of 16 rows the more so).
BATCH_MAX_ROWS = 64
BATCH_PROBE_ROWS = 43
# large_product()'s probe: a prefill chunk's size, and a multiple of 16 rows (MKL's best case).
LARGE_PROBE_ROWS = 512
Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def _split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows, (out_features, in_features) = x.shape[0], weight.shape
    if out_features % 2:
        return F.linear(x, weight, bias)
    if rows == 1:
        x = torch.cat((x, x))
    halves = torch.matmul(weight.view(2, out_features // 2, in_features), x.t())
    out = halves.view(out_features, -1).t()[:rows]
    return out if bias is None else out + bias


def _candidates() -> dict[str, Product]:
    found: dict[str, Product] = {"linear": F.linear, "split": _split}
    kernel = cpu_kernels.load()
    if kernel is not None:
        found["kernel"] = kernel.float32_linear
    return found


def _fastest(candidates: dict[str, Product], rows: int, matrices: int = 24) -> tuple[str, Product]:
    """The candidate that runs `rows` rows fastest against weights that are not in cache, as in
    a decode step (each layer's weights are read once per step): by default a few dozen MB of
    distinct matrices (about 85 MB), the best of three passes each. They lie on huge pages, as
    a model's weights do (engine/huge_pages.py): a stream of rows reads far faster there, and
    not by the same factor for every candidate."""
    shape = (1536, 576)
    store = torch.empty(matrices, *shape)
    huge_pages.advise(store)  # before the first write
    weights = list(store.normal_().unbind())
    x = torch.randn(rows, 576)
    timings = {}
    for name, product in candidates.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for weight in weights:
                product(x, weight, None)
            best = min(best, time.perf_counter() - start)
        timings[name] = best
    name = min(timings, key=timings.__getitem__)
    return name, candidates[name]


@functools.cache
def decode_product() -> tuple[str, Product]:
    """The fastest product for one row (a batch-1 decode step)."""
    return _fastest(_candidates(), 1)


@functools.cache
def batch_product() -> tuple[str, Product]:
    """The fastest product for a decode batch, measured at a batch's size that is a multiple of
    no tile of either side's (MKL's best case is a multiple of 16 rows)."""
    found: dict[str, Product] = {"split": _split}
    kernel = cpu_kernels.load()
    if kernel is not None:
        found["gemm"] = kernel.float32_gemm
    return _fastest(found, BATCH_PROBE_ROWS)


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_serves() -> bool:
    """Whether this PyTorch has oneDNN's linear and it agrees with MKL's (a private op: a build
    without it, or one that computes something else, leaves MKL)."""
    if not torch.backends.mkldnn.is_available():
        return False
    x, weight, bias = torch.randn(5, 40), torch.randn(24, 40), torch.randn(24)
    try:
        return torch.allclose(_onednn(x, weight, bias), F.linear(x, weight, bias), 1e-5, 1e-4)
    except (RuntimeError, AttributeError):
        return False


@functools.cache
def large_product() -> tuple[str, Product]:
    """The product for more rows than BATCH_MAX_ROWS (prefill chunks, large decode batches),
    measured at a prefill chunk's size: MKL's `linear`, oneDNN's, and float32_gemm where it won
    batch_product() (the rows are compute-bound: a few matrices that stay in cache serve)."""
    found: dict[str, Product] = {"linear": F.linear}
    if _onednn_serves():
        found["onednn"] = _onednn
    if batch_product()[0] == "gemm":
        found["gemm"] = batch_product()[1]
    return _fastest(found, LARGE_PROBE_ROWS, 4) if len(found) > 1 else ("linear", F.linear)


def compiled_max_rows() -> int:
    """Rows up to which linear() runs a contiguous float32 weight through the compiled products
    alone (float32_linear up to DECODE_MAX_ROWS, float32_gemm beyond; with no bound where it
    won the large measurement too): what the decode stack may call in its place
    (kernels/decode_stack.py). 0 where MKL won the one-row measurement."""
    if decode_product()[0] != "kernel":
        return 0
    if batch_product()[0] != "gemm":
        return DECODE_MAX_ROWS
    return sys.maxsize if large_product()[0] == "gemm" else BATCH_MAX_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.shape[0]
    if not x.is_cpu:
        return F.linear(x, weight, bias)
    compiled = x.dtype == weight.dtype == torch.float32 and weight.is_contiguous()
    if rows <= DECODE_MAX_ROWS and x.dtype == weight.dtype == torch.float32:
        name, product = decode_product()
        if name != "kernel" or compiled:
            return product(x, weight, bias)
        return F.linear(x, weight, bias)
    if rows <= BATCH_MAX_ROWS and compiled:
        return batch_product()[1](x, weight, bias)
    if compiled and large_product()[0] != "linear":
        return large_product()[1](x, weight, bias)
    return _split(x, weight, bias) if rows <= SPLIT_MAX_ROWS else F.linear(x, weight, bias)
