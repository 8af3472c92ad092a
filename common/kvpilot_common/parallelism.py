"""Tensor parallelism's arithmetic: which sizes a model may be split into, and what each rank
holds. Pure: the engine, the memory model, `kvpilot plan` and the operator share it.

Megatron-style: every rank holds heads / N query heads and intermediate / N MLP columns. Key/value
heads are split the same way when there are at least N of them; with fewer (grouped-query models
with few KV heads), each rank holds one KV head, replicated across the N / kv_heads ranks whose
query heads read it, as vLLM does, so N must then be a multiple of kv_heads.
"""

MAX_TENSOR_PARALLEL_SIZE = 8  # the GPUs of one node: what the CRD allows


def problem(heads: int, kv_heads: int, size: int) -> str | None:
    """Why `size` ranks cannot split a model with these heads, or None when they can."""
    if size < 1:
        return f"tensor parallel size must be at least 1, not {size}"
    if heads % size:
        return (
            f"tensor parallel size {size} does not divide the model's {heads} attention heads "
            f"(choose one of {', '.join(map(str, divisors(heads, kv_heads)))})"
        )
    if kv_heads % size and size % kv_heads:
        return (
            f"tensor parallel size {size} and the model's {kv_heads} key/value heads do not "
            "divide one another: each rank needs whole key/value heads"
        )
    return None


def divisors(heads: int, kv_heads: int) -> list[int]:
    """The sizes up to MAX_TENSOR_PARALLEL_SIZE that can split this model."""
    sizes = range(1, MAX_TENSOR_PARALLEL_SIZE + 1)
    return [n for n in sizes if problem_free(heads, kv_heads, n)]


def problem_free(heads: int, kv_heads: int, size: int) -> bool:
    return heads % size == 0 and (kv_heads % size == 0 or size % kv_heads == 0)


def kv_heads_per_rank(kv_heads: int, size: int) -> int:
    """KV heads each rank stores: a share, or one replicated head when there are fewer than N."""
    return max(1, kv_heads // size)


def kv_head_start(kv_heads: int, size: int, rank: int) -> int:
    """The first KV head rank `rank` stores (the one its first query head reads)."""
    if kv_heads >= size:
        return rank * (kv_heads // size)
    return rank // (size // kv_heads)
