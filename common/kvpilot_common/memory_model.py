"""How much memory a model needs and how many sequences its KV cache holds. Pure arithmetic:
imports nothing heavy, so the operator can decide before creating pods whether a model fits.

weights   = params in the linear layers x bytes per weight (quantization; int4 adds a float32
            scale and minimum per group) + embeddings and lm_head at the model dtype, or with
            an int8 lm_head one byte per lm_head weight and a float32 scale per vocabulary row
            (tied: the embedding reads the same int8 table; untied: it keeps the model dtype)
kv/token  = 2 (K and V) x layers x kv_heads x (head_dim x bytes per KV element
            + a float32 scale when the KV cache is quantized: one per token per kv head)
kv budget = (device memory - weights - runtime headroom - a GPU step's workspace) x kv fraction
            (the workspace: step_memory.py; the engine measures what is free instead)

With tensor parallelism over N GPUs every figure is per GPU: the decoder's linear layers are
split N ways, the embedding and lm_head are replicated (engine/distributed/sharding.py says
why), each GPU stores kv_heads / N KV heads (one, replicated, when there are fewer heads than
GPUs), and the replica holds as many tokens as one GPU's KV budget does. Norms (a few thousand
parameters per layer) and a mixture of experts' routers (one row per expert) are counted as
split and quantized, though the engine keeps them replicated in the model dtype.

A mixture of experts keeps every expert resident, so weights count them all (`params`); a token
reads only its top-k (`active_params`), which sets the cost of a decode step, not the memory.
Every layer's KV cache is counted for every token, also where a model attends through a sliding
window (gpt-oss, Gemma 3): for those the figures are an upper bound.

The bytes per weight and per KV element, and the architectures' layouts, are
kvpilot_common.precision's: the engine allocates by the same rules.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from kvpilot_common import parallelism, precision
from kvpilot_common.errors import UnsupportedArchitectureError
from kvpilot_common.experts import Experts
from kvpilot_common.experts import from_config as read_experts

MiB = 1 << 20
GiB = 1 << 30

# The CUDA context, the allocator's slack, the libraries' own buffers (cuBLAS workspaces): kept
# free besides weights, KV cache and a step's workspace (step_memory.py).
RUNTIME_HEADROOM_BYTES = 2 * GiB

# Usable memory of one GPU, MiB (what nvidia-smi reports as total).
GPU_MEMORY_MIB = {
    "T4": 15360,
    "A10G": 23028,
    "L4": 23034,
    "L40S": 46068,
    "A100-40GB": 40960,
    "A100-80GB": 81920,
    "H100-80GB": 81559,
    "H200": 143771,
}
# Compute capability of the same GPUs: fp8 (weights or KV cache) needs
# precision.FP8_MIN_COMPUTE_CAPABILITY or newer.
GPU_COMPUTE_CAPABILITY = {
    "T4": (7, 5),
    "A10G": (8, 6),
    "L4": (8, 9),
    "L40S": (8, 9),
    "A100-40GB": (8, 0),
    "A100-80GB": (8, 0),
    "H100-80GB": (9, 0),
    "H200": (9, 0),
}


@dataclass(frozen=True)
class ModelShape:
    params: int  # all parameters, embeddings included, and every expert: all are resident
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_position: int  # the model's own context limit
    heads: int  # attention heads: what tensor parallelism must divide
    architecture: str  # config.json's "architectures"[0]; the engine serves precision's
    # The parameters one token uses, as the model cards count them (Qwen3-30B-A3B's "3.3B
    # activated", Mixtral's "12.9B active"): all but the routed experts it is not sent to, the
    # embedding table and lm_head counted whole. OpenAI's gpt-oss figures (3.6B, 5.1B) leave
    # out the embedding table, of which a token reads one row. Dense models: params.
    active_params: int
    experts: Experts | None = None  # None: a dense model
    # Why the engine refuses the checkpoint's stored form (pre-quantized), or None.
    prequantized: str | None = None

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


def unserved(shape: ModelShape) -> str | None:
    """Why the engine would refuse to load this model, in its own words, or None when it
    serves the architecture."""
    if shape.architecture in precision.ARCHITECTURES:
        return shape.prequantized
    return str(UnsupportedArchitectureError(shape.architecture, list(precision.ARCHITECTURES)))


@dataclass(frozen=True)
class _Extras:
    """A layer's tensors beyond what precision.layout describes: Gemma's extra norms, gpt-oss's
    sinks and router and expert biases (engine/models/gpt_oss.py builds the same), and the
    layouts of any architecture the catalogue plans for and the engine does not serve
    (precision.layout takes those to be plain Llama)."""

    qk_norm: bool = False
    norms: int = 2  # RMSNorms of `hidden` weights per layer
    sinks: bool = False  # a learned attention-sink logit per head
    router_bias: bool = False
    expert_bias: bool = False  # on each expert's gate, up and down projections


_EXTRAS = {
    # Biases on q, k, v and o (attention_bias: true); gate and up fused, the same count.
    "GptOssForCausalLM": _Extras(sinks=True, router_bias=True, expert_bias=True),
    # Norms before and after both attention and the MLP; q and k normalized per head. The
    # multimodal checkpoint's vision tower (0.4B for the 27B) is not counted.
    "Gemma2ForCausalLM": _Extras(norms=4),
    "Gemma3ForCausalLM": _Extras(qk_norm=True, norms=4),
    "Gemma3ForConditionalGeneration": _Extras(qk_norm=True, norms=4),
    # Phi3ForCausalLM fuses q, k and v, and gate and up: Llama's counts.
}


def shape_from_config(config: Mapping) -> ModelShape:
    """A decoder's shape from its Hugging Face config.json (a plain dict): Llama's block with
    precision's quirks, the experts kvpilot_common.experts reads, and the few layouts the
    catalogue knows but the engine does not serve (_EXTRAS)."""
    architecture = precision.architecture_name(config)
    config = {**config, **(config.get("text_config") or {})}  # multimodal: the language model
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    vocab = config["vocab_size"]
    tied = bool(config.get("tie_word_embeddings", False))
    layout = precision.layout(
        architecture, config.get("attention_bias", False), config.get("mlp_bias", False)
    )
    extras = _EXTRAS.get(architecture, _Extras())
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o, k, v
    if layout.qkv_bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    if layout.o_bias:
        attention += hidden
    attention += heads if extras.sinks else 0
    norms = extras.norms * hidden + (2 * head_dim if layout.qk_norm or extras.qk_norm else 0)
    inter = config["intermediate_size"]  # the dense MLP's (Mixtral, gpt-oss: each expert's)
    dense = 3 * hidden * inter + (2 * inter + hidden if layout.mlp_bias else 0)  # gate, up, down
    experts = read_experts(config)
    moe = _sparse_mlp(hidden, experts, extras) if experts else (0, 0)
    total = active = layers * (attention + norms) + hidden + vocab * hidden * (1 if tied else 2)
    for sparse in experts.sparse_layers if experts else (False,) * layers:
        resident, used = moe if sparse else (dense, dense)
        total, active = total + resident, active + used
    return ModelShape(
        params=total,
        hidden=hidden,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        tied_embeddings=tied,
        max_position=config.get("max_position_embeddings", 4096),
        heads=heads,
        architecture=architecture,
        active_params=active,
        experts=experts,
        prequantized=precision.prequantized_problem(
            config.get("quantization_config"), architecture
        ),
    )


def _sparse_mlp(hidden: int, experts: Experts, extras: _Extras) -> tuple[int, int]:
    """One sparse layer's MLP parameters: resident (every expert) and used by one token."""
    one = 3 * hidden * experts.width + (2 * experts.width + hidden if extras.expert_bias else 0)
    router = experts.count * hidden + (experts.count if extras.router_bias else 0)
    # The shared expert runs for every token, scaled by a sigmoid gate of one row.
    shared = 3 * hidden * experts.shared_width + hidden if experts.shared_width else 0
    return router + shared + experts.count * one, router + shared + experts.top_k * one


@dataclass(frozen=True)
class Plan:
    """Per GPU (of tensor_parallel_size), but for the tokens and sequences, which are the
    replica's (every GPU holds its share of each token)."""

    weight_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int  # what the KV cache gets (0 or less: nothing left after the weights)
    max_model_len: int
    tensor_parallel_size: int = 1
    adapter_bytes: int = 0  # LoRA slots, whole on every GPU
    # The engine's cache is whole blocks, less those it keeps out of the pool (a GPU's CUDA
    # graphs write their padding rows into one scratch block: engine/runtime/cuda_graphs.py).
    block_size: int = 1
    reserved_blocks: int = 0

    @property
    def kv_tokens(self) -> int:
        per_block = self.kv_bytes_per_token * self.block_size
        blocks = max(0, self.kv_cache_bytes) // per_block - self.reserved_blocks
        return max(0, blocks) * self.block_size

    @property
    def sequences_at_max_len(self) -> int:
        return self.kv_tokens // self.max_model_len

    @property
    def fits(self) -> bool:
        return self.sequences_at_max_len >= 1


def weight_bytes(
    shape: ModelShape,
    dtype: str,
    quantization: str = precision.DEFAULT_QUANTIZATION,
    group_size: int = precision.INT4_DEFAULT_GROUP_SIZE,
    lm_head_quantization: str = precision.DEFAULT_LM_HEAD_QUANTIZATION,
    tensor_parallel_size: int = 1,
) -> int:
    """Weights on one GPU of tensor_parallel_size."""
    full = _dtype_bytes(dtype)
    per_weight = precision.bytes_per_weight(quantization, full, group_size)
    linear = shape.params - shape.embedding_params
    embeddings = precision.lm_head_bytes(
        lm_head_quantization, shape.vocab, shape.hidden, shape.tied_embeddings, full
    )
    return int(linear * per_weight) // tensor_parallel_size + embeddings


def lora_slot_bytes(shape: ModelShape, slots: int, max_rank: int, dtype: str) -> int:
    """What the engine's LoRA slots hold (engine/lora/layers.py): for every decoder projection,
    `slots` stacks of A [parts * rank, in] and B [parts * rank, out], in the model's dtype. The
    MLP's width is not in the shape; a dense layer's parameters give it (q, k, v and o, then
    three MLP matrices of hidden x width). A mixture of experts' MLP carries no adapters."""
    hidden, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attention = 3 * (hidden + q + 2 * kv) + (q + hidden)  # parts * (in + out), over rank
    mlp = 0
    if shape.experts is None:
        per_layer = (shape.params - shape.embedding_params) // shape.layers
        width = max(0, per_layer - hidden * (2 * q + 2 * kv)) // (3 * hidden)
        mlp = 2 * (hidden + 2 * width) + (width + hidden)
    return slots * max_rank * shape.layers * (attention + mlp) * _dtype_bytes(dtype)


def kv_bytes_per_token(
    shape: ModelShape,
    dtype: str,
    kv_cache_dtype: str = precision.DEFAULT_KV_CACHE_DTYPE,
    tensor_parallel_size: int = 1,
) -> int:
    """KV bytes of one token on one GPU of tensor_parallel_size."""
    per_head = precision.kv_bytes_per_head(shape.head_dim, kv_cache_dtype, _dtype_bytes(dtype))
    kv_heads = parallelism.kv_heads_per_rank(shape.kv_heads, tensor_parallel_size)
    return 2 * shape.layers * kv_heads * per_head


def kv_cache_budget(free_bytes: int, workspace_bytes: int, fraction: float) -> int:
    """Bytes the KV cache may take of what is free once the weights are in place: the
    fraction of what a step's workspace (step_memory.py) leaves."""
    return int(max(0, free_bytes - workspace_bytes) * fraction)


def _dtype_bytes(dtype: str) -> int:
    size = precision.DTYPES[dtype].bytes
    if size is None:  # auto: the caller resolves it (precision.resolve_dtype), knowing the device
        raise KeyError(f"dtype {dtype!r} has no size before it is resolved for a device")
    return size


def plan(
    shape: ModelShape,
    memory_bytes: int,
    max_model_len: int,
    dtype: str = precision.AUTO_DTYPE_GPU,
    quantization: str = precision.DEFAULT_QUANTIZATION,
    kv_cache_dtype: str = precision.DEFAULT_KV_CACHE_DTYPE,
    kv_fraction: float = 0.9,
    headroom_bytes: int = RUNTIME_HEADROOM_BYTES,
    group_size: int = precision.INT4_DEFAULT_GROUP_SIZE,
    lm_head_quantization: str = precision.DEFAULT_LM_HEAD_QUANTIZATION,
    tensor_parallel_size: int = 1,
    adapter_bytes: int = 0,  # LoRA slots (lora_slot_bytes), counted whole on every GPU
    workspace_bytes: int = 0,  # a GPU step's transient memory (step_memory.py)
    block_size: int = 1,  # the engine's KV block: the cache holds whole ones
    reserved_blocks: int = 0,  # blocks kept out of the pool (Plan says which)
) -> Plan:
    """memory_bytes and headroom_bytes are one GPU's; the model spans tensor_parallel_size."""
    size = tensor_parallel_size
    weights = weight_bytes(shape, dtype, quantization, group_size, lm_head_quantization, size)
    free = memory_bytes - weights - headroom_bytes - adapter_bytes
    kv = kv_cache_budget(free, workspace_bytes, kv_fraction)
    return Plan(
        weight_bytes=weights,
        kv_bytes_per_token=kv_bytes_per_token(shape, dtype, kv_cache_dtype, size),
        # Negative: how far the weights alone are over (the plan says so in words).
        kv_cache_bytes=kv if free > 0 else free,
        max_model_len=max_model_len,
        tensor_parallel_size=size,
        adapter_bytes=adapter_bytes,
        block_size=block_size,
        reserved_blocks=reserved_blocks,
    )
