"""Batch limits and KV block size where a deployment names none, chosen from the device: one rule
for the engine at start, `kvpilot plan` and the operator's fit check, so a plan sizes the same
step workspace and cache that the pod will.

- CPU: 64 sequences, 2048 tokens a step, blocks of 16 tokens. A few cores' decode step reads
  every weight once, whatever its rows, until the products turn compute-bound at a few dozen
  rows: more sequences than that add latency to each without adding throughput, and a larger
  step stalls every running stream behind one long prefill chunk.
- GPU: vLLM's two tiers for a step's token budget. A device of LARGE_GPU_BYTES or more takes
  8192 tokens (H100, H200, MI300X), except an A100, where vLLM measured the larger budget
  lowering throughput; smaller GPUs 2048. Sequences: 256 on any GPU. A 16-bit decode step's
  products read each weight once for all its rows, so they stay bound by memory until the rows
  reach the GPU's ratio of FLOPs to bytes, a few hundred on current GPUs; past that more
  sequences add latency to each, not throughput, and every sequence allowed costs the step's
  workspace its sampler rows and a larger CUDA graph (step_memory), memory the KV cache needs.
- Block size on GPU: FLASH_PAGE tokens where the flash path may read the cache
  (engine/layers/flash_attention.py): torch's FlashAttention 2 reads a paged cache only in
  pages of a multiple of it. Elsewhere 16: prefix caching reuses whole blocks and the reference
  path gathers and pads whole blocks, so small blocks share more and pad less. The engine
  knows everything that decides the flash path (the model's attention, the GPU's generation,
  torch's kernel); a plan and the fit check know what a spec and the model's architecture show
  (`flash_may_read`).

Standard library only: the operator imports it.
"""

from dataclasses import dataclass

from kvpilot_common import precision

GiB = 1 << 30
LARGE_GPU_BYTES = 70 * GiB
# torch's flash kernel (FlashAttention 2) refuses a block table over pages of other sizes.
FLASH_PAGE = 256
SMALL_BLOCK = 16
FLASH_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class BatchLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int


CPU = BatchLimits(max_num_seqs=64, max_num_batched_tokens=2048, block_size=SMALL_BLOCK)
GPU_SEQS, GPU_TOKENS, LARGE_GPU_TOKENS = 256, 2048, 8192


def defaults(
    *, gpu: bool, memory: int | None = None, name: str = "", flash: bool = False
) -> BatchLimits:
    """The limits for one device: `memory` its bytes (None: not known, the smaller tier), `name`
    its model as the driver or the deployment names it, `flash` whether the flash path may read
    the cache there."""
    if not gpu:
        return CPU
    large = memory is not None and memory >= LARGE_GPU_BYTES and "a100" not in name.lower()
    return BatchLimits(
        max_num_seqs=GPU_SEQS,
        max_num_batched_tokens=LARGE_GPU_TOKENS if large else GPU_TOKENS,
        block_size=FLASH_PAGE if flash else SMALL_BLOCK,
    )


def flash_may_read(dtype: str, kv_cache_dtype: str, architecture: str = "") -> bool:
    """What settings and a model's architecture show of whether the flash path may read the
    cache: a 16-bit model (its dtype resolved for the device), a cache of that dtype
    (kv_cache_dtype auto), and attention without logit caps or sink logits."""
    quirks = precision.ARCHITECTURES.get(architecture, precision.Architecture())
    eager = quirks.attention_softcap or quirks.attention_sinks
    return dtype in FLASH_DTYPES and kv_cache_dtype == "auto" and not eager


def settle(
    chosen: BatchLimits,
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    block_size: int | None,
) -> BatchLimits:
    """What was asked for, each unset limit taken from `chosen` (defaults(...) for the device)."""
    return BatchLimits(
        max_num_seqs=chosen.max_num_seqs if max_num_seqs is None else max_num_seqs,
        max_num_batched_tokens=(
            chosen.max_num_batched_tokens
            if max_num_batched_tokens is None
            else max_num_batched_tokens
        ),
        block_size=chosen.block_size if block_size is None else block_size,
    )


def planned(
    *,
    gpu: bool,
    memory: int | None,
    name: str,
    dtype: str,
    kv_cache_dtype: str,
    architecture: str,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    block_size: int | None,
) -> BatchLimits:
    """What a plan of one device expects its engine to run with: what was asked for, the rest
    as the engine would choose there from what settings and the architecture show."""
    chosen = defaults(
        gpu=gpu,
        memory=memory,
        name=name,
        flash=flash_may_read(dtype, kv_cache_dtype, architecture),
    )
    return settle(
        chosen,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
    )
