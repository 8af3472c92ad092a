"""Paged attention on CUDA: one varlen flash-attention call per layer for every decode and
prefill chunk of a step, reading K and V in place through the block table.

The reference path (attention.py) gathers each decode group's padded blocks into a workspace
and runs SDPA with a boolean mask, which on a GPU reads the cache about three times over and,
for a masked prefill with grouped-query heads, falls to SDPA's math backend.
torch.nn.attention.varlen.varlen_attn takes kvpilot's cache as it is laid out ([pages,
page_size, kv_heads, head_dim]) with an int32 block table and each sequence's length
(seqused_k), aligns a chunk's causal mask to the end of its context (a later chunk attends to
everything cached before it), and has sliding windows (kvpilot's window w: flash's left window
w - 1, the query's own key included) and grouped-query heads.

It serves where it can: CUDA on an Ampere or newer GPU, a 16-bit model, an unquantized cache,
no logit softcap or sinks (Gemma 2, gpt-oss keep the reference path), a torch whose varlen_attn
takes a block table. And only once it has agreed with the reference path on the model's own
head shape at start (`self_test`): code that has never run on this GPU must not be able to take
the server down, so any disagreement or error is logged and the reference path serves instead.
"""

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvpilot_common import batch_limits

log = logging.getLogger(__name__)
# bfloat16 against bfloat16: two summation orders of the same products.
AGREEMENT = 0.02
# torch's flash kernel (FlashAttention 2) refuses a block table over pages of other sizes; the
# GPU's default block size is this where the flash path may serve (kvpilot_common.batch_limits).
PAGE_MULTIPLE = batch_limits.FLASH_PAGE
# Ampere and newer: the GPUs torch's FlashAttention 2 kernels are built for.
FLASH_MIN_CAPABILITY = (8, 0)


@dataclass
class FlashBatch:
    """A step's sequences as varlen_attn reads them, in the step's row order."""

    cu_seq_q: torch.Tensor  # [N + 1] int32: sequence i's queries are rows [cu[i], cu[i + 1])
    # [N + 1] int32, cumulative keys: the kernel reads seqused_k and the block table, but its
    # entry check wants both cumulative tensors or neither.
    cu_seq_k: torch.Tensor
    seqused_k: torch.Tensor  # [N] int32: keys each attends to (its own included)
    block_table: torch.Tensor  # [N, pages] int32, padded with block 0
    max_q: int
    max_k: int


@functools.cache
def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "block_table" in inspect.signature(varlen_attn).parameters else None


def unusable(
    device: torch.device, dtype: torch.dtype, quantized_cache: bool, eager: bool, block_size: int
) -> str:
    """Why the flash path cannot serve this model here, or '' when it may (pending self_test)."""
    if device.type != "cuda":
        return "not a CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if capability < FLASH_MIN_CAPABILITY:
        return "FlashAttention 2 needs compute capability {}.{} or newer, not {}.{}".format(
            *FLASH_MIN_CAPABILITY, *capability
        )
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash attention needs a 16-bit model, not {dtype}"
    if quantized_cache:
        return "a quantized KV cache is read by the reference path"
    if eager:
        return "logit softcapping or attention sinks need the reference path's eager softmax"
    # Last: the other reasons hold whatever the block size, and are the ones to say.
    if block_size % PAGE_MULTIPLE:
        return (
            f"flash attention reads a paged cache in blocks of a multiple of {PAGE_MULTIPLE} "
            f"tokens, and these are of {block_size} (--block-size {PAGE_MULTIPLE} serves it)"
        )
    if _varlen() is None:
        return f"torch {torch.__version__}'s varlen_attn takes no block table"
    return ""


@dataclass
class FlashNumbers:
    """A FlashBatch's numbers on the host, before they are sent (runtime/staging.py)."""

    cu_seq_q: list[int]
    cu_seq_k: list[int]
    seqused_k: list[int]
    block_table: list[int]  # rows of `pages` entries, one after another
    pages: int
    max_q: int
    max_k: int

    @property
    def parts(self) -> list[list[int]]:
        return [self.cu_seq_q, self.cu_seq_k, self.seqused_k, self.block_table]


def numbers_of(entries: list[tuple[int, int, list[int]]]) -> FlashNumbers:
    """(tokens cached before the step, tokens in the step, block table) per sequence."""
    pages = max(len(table) for _, _, table in entries)
    queries = [n for _, n, _ in entries]
    cu = [0]
    for n in queries:
        cu.append(cu[-1] + n)
    lengths = [computed + n for computed, n, _ in entries]
    cu_k = [0]
    for length in lengths:
        cu_k.append(cu_k[-1] + length)
    tables = [b for _, _, table in entries for b in table + [0] * (pages - len(table))]
    return FlashNumbers(cu, cu_k, lengths, tables, pages, max(queries), max(lengths))


def batch_from(numbers: FlashNumbers, sent: list[torch.Tensor]) -> FlashBatch:
    """The batch from its parts sent to the device (integer tensors, in `parts` order)."""
    cu, cu_k, lengths, tables = (t.to(torch.int32) for t in sent)
    return FlashBatch(
        cu, cu_k, lengths, tables.view(-1, numbers.pages), numbers.max_q, numbers.max_k
    )


def batch_of(entries: list[tuple[int, int, list[int]]], device: torch.device) -> FlashBatch:
    """The batch of `entries` (see numbers_of), each part sent on its own."""
    numbers = numbers_of(entries)
    return batch_from(numbers, [torch.tensor(part, device=device) for part in numbers.parts])


def attend(
    q: torch.Tensor, cache, batch: FlashBatch, window: int | None, scale: float | None
) -> torch.Tensor:
    """q [N, heads, head_dim] against the cache (this step's K/V already written to it)."""
    varlen_attn = _varlen()
    assert varlen_attn is not None
    left = -1 if window is None else window - 1
    return varlen_attn(
        q,
        cache.k,
        cache.v,
        batch.cu_seq_q,
        batch.cu_seq_k,
        batch.max_q,
        batch.max_k,
        scale=scale,
        window_size=(left, 0),
        enable_gqa=True,
        seqused_k=batch.seqused_k,
        block_table=batch.block_table,
    )


def self_test(run_both: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> str:
    """'' when the fast path agrees with the reference on a small step (run_both returns
    (fast, reference) outputs); else why not, in words, for the log."""
    try:
        fast, reference = run_both()
        error = float((fast.float() - reference.float()).norm() / reference.float().norm())
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    if not error < AGREEMENT:  # NaN included
        return f"it disagrees with the reference path (relative error {error:.3g})"
    return ""
