"""What one engine step holds on a GPU besides the weights and the KV cache, and so what the KV
cache must leave free. One rule for the engine sizing its cache at start and for `kvpilot plan`
and the operator's fit check deciding before any pod exists.

A step's transient memory is its activations, for at most max_num_batched_tokens tokens, and
the sampler's rows, for at most max_num_seqs sequences:

activations = tokens x (3 x hidden [the residual stream, its norm, a layer's output]
              + q + 2 kv [the fused q/k/v product] + q [attention's output]
              + 3 x mlp width [gate and up together, then the activation]) x dtype bytes
sampler     = seqs x vocab x SAMPLER_ROW_COPIES x 4 (float32 logits and the batch's working
              copies of them: engine/runtime/sampler.py)
graphs      = the ladder's sizes up to seqs, summed, x vocab x 4 (each CUDA graph's logits)

Each rank of tensor parallelism holds its share of the heads and of the MLP's width, and whole
rows of the residual stream and of the logits. A mixture of experts is counted at the width a
token's routed experts add up to. Then:

kv cache = (free memory - step workspace) x kv_cache_memory_fraction (memory_model's
kv_cache_budget), where free memory is what the device reports free once the weights are in
place: the engine measures it, a plan computes it (device memory - weights - runtime headroom
- adapters).
"""

from kvpilot_common import parallelism, precision
from kvpilot_common.memory_model import ModelShape

# A GPU engine that may replay CUDA graphs keeps this many KV blocks out of its pool: the
# graphs' padding rows write into them (engine/runtime/cuda_graphs.py).
GRAPH_SCRATCH_BLOCKS = 1
# CUDA graphs are captured for these batch sizes up to max_num_seqs (engine/runtime/cuda_graphs.py).
GRAPH_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# The sampler's [seqs, vocab] float32 tensors alive at its peak: the logits, the masked copy,
# the penalised copy, the probabilities, the sorted probabilities with their int64 order (two
# rows' worth), the exponential draws and their quotient.
SAMPLER_ROW_COPIES = 9


def step_workspace_bytes(
    *, hidden: int, q: int, kv: int, mlp: int, vocab: int, item: int, tokens: int, seqs: int
) -> int:
    """The transient bytes of the largest step on one device: q, kv and mlp are that device's
    widths (q heads x head_dim, kv heads x head_dim, the MLP's or routed experts' width), item
    the model dtype's bytes, tokens and seqs max_num_batched_tokens and max_num_seqs."""
    activations = tokens * (3 * hidden + q + 2 * kv + q + 3 * mlp) * item
    # Each captured graph keeps its own float32 logits; their other memory is one shared pool
    # of a step's activations, counted above.
    graph_outputs = sum(graph_sizes(seqs)) * vocab * 4
    return activations + seqs * vocab * SAMPLER_ROW_COPIES * 4 + graph_outputs


def graph_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes captured: the ladder up to max_num_seqs, and max_num_seqs itself."""
    return sorted({s for s in GRAPH_LADDER if s < max_num_seqs} | {max_num_seqs})


def workspace_of(
    shape: ModelShape,
    dtype: str,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tensor_parallel_size: int = 1,
) -> int:
    """step_workspace_bytes for a model known by its shape (a plan, the operator's fit check),
    on one GPU of tensor_parallel_size."""
    size = tensor_parallel_size
    item = precision.DTYPES[dtype].bytes
    if item is None:
        raise KeyError(f"dtype {dtype!r} has no size before it is resolved for a device")
    return step_workspace_bytes(
        hidden=shape.hidden,
        q=shape.heads * shape.head_dim // size,
        kv=parallelism.kv_heads_per_rank(shape.kv_heads, size) * shape.head_dim,
        mlp=_mlp_width(shape) // size,
        vocab=shape.vocab,
        item=item,
        tokens=max_num_batched_tokens,
        seqs=max_num_seqs,
    )


def _mlp_width(shape: ModelShape) -> int:
    """A decoder layer's MLP width as its parameters give it (q, k, v, o, then three matrices
    of hidden x width); for a mixture of experts, what a token's routed experts add up to."""
    if shape.experts is not None:
        experts = shape.experts
        return experts.top_k * experts.width + experts.shared_width
    hidden = shape.hidden
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = (shape.params - shape.embedding_params) // shape.layers
    return max(0, per_layer - hidden * (2 * q + 2 * kv)) // (3 * hidden)
