"""How much memory a model needs and how many sequences its KV cache holds. Pure arithmetic:
imports nothing heavy, so the operator can decide before creating pods whether a model fits.

weights   = params in the linear layers x bytes per weight (quantization; int4 adds a float32
            scale and minimum per group) + embeddings and lm_head at the model dtype, or with
            an int8 lm_head one byte per lm_head weight and a float32 scale per vocabulary row
            (tied: the embedding reads the same int8 table; untied: it keeps the model dtype)
kv/token  = 2 (K and V) x layers x kv_heads x (head_dim x bytes per KV element
            + a float32 scale when the KV cache is quantized: one per token per kv head)
kv budget = (device memory - weights - runtime headroom) x kv fraction

With tensor parallelism over N GPUs every figure is per GPU: the decoder's linear layers are
split N ways, the embedding and lm_head are replicated (engine/distributed/sharding.py says
why), each GPU stores kv_heads / N KV heads (one, replicated, when there are fewer heads than
GPUs), and the replica holds as many tokens as one GPU's KV budget does. Norms (a few thousand
parameters per layer) are counted as split, though replicated.

The bytes per weight and per KV element, and the architectures' layouts, are
kvpilot_common.precision's: the engine allocates by the same rules.
"""

from dataclasses import dataclass

from kvpilot_common import parallelism, precision
from kvpilot_common.naming import BUNDLED_MODEL

MiB = 1 << 20
GiB = 1 << 30

# Activations, CUDA context, allocator slack: kept free besides weights and KV cache.
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
    params: int  # all parameters, embeddings included
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_position: int  # the model's own context limit
    heads: int  # attention heads: what tensor parallelism must divide

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


def shape_from_config(config: dict) -> ModelShape:
    """A Llama-family model's shape from its Hugging Face config.json (a plain dict)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    vocab, inter = config["vocab_size"], config["intermediate_size"]
    tied = bool(config.get("tie_word_embeddings", False))
    layout = precision.layout(
        precision.architecture_name(config),
        config.get("attention_bias", False),
        config.get("mlp_bias", False),
    )
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o, k, v
    if layout.qkv_bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    if layout.o_bias:
        attention += hidden
    mlp = 3 * hidden * inter + (2 * inter + hidden if layout.mlp_bias else 0)  # gate, up, down
    norms = 2 * hidden + (2 * head_dim if layout.qk_norm else 0)
    per_layer = attention + mlp + norms
    params = layers * per_layer + hidden + vocab * hidden * (1 if tied else 2)
    return ModelShape(
        params=params,
        hidden=hidden,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        tied_embeddings=tied,
        max_position=config.get("max_position_embeddings", 4096),
        heads=heads,
    )


# Known models by source, so the fit check works before anything is downloaded.
KNOWN_MODELS = {
    BUNDLED_MODEL: ModelShape(134_515_008, 576, 30, 3, 64, 49152, True, 8192, 9),
    "hf://Qwen/Qwen2.5-0.5B-Instruct": ModelShape(
        494_032_768, 896, 24, 2, 64, 151936, True, 32768, 14
    ),
    "hf://Qwen/Qwen2.5-7B-Instruct": ModelShape(
        7_615_616_512, 3584, 28, 4, 128, 152064, False, 32768, 28
    ),
    "hf://Qwen/Qwen3-8B": ModelShape(8_190_735_360, 4096, 36, 8, 128, 151936, False, 40960, 32),
    "hf://meta-llama/Llama-3.1-8B-Instruct": ModelShape(
        8_030_261_248, 4096, 32, 8, 128, 128256, False, 131072, 32
    ),
    "hf://meta-llama/Llama-3.1-70B-Instruct": ModelShape(
        70_553_706_496, 8192, 80, 8, 128, 128256, False, 131072, 64
    ),
    "hf://mistralai/Mistral-7B-Instruct-v0.3": ModelShape(
        7_248_023_552, 4096, 32, 8, 128, 32768, False, 32768, 32
    ),
}


@dataclass(frozen=True)
class Plan:
    """Per GPU (of tensor_parallel_size), but for the tokens and sequences, which are the
    replica's (every GPU holds its share of each token)."""

    weight_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int  # what the KV cache gets (0 or less: nothing left after the weights)
    max_model_len: int
    tensor_parallel_size: int = 1

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_cache_bytes) // self.kv_bytes_per_token

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
) -> Plan:
    """memory_bytes and headroom_bytes are one GPU's; the model spans tensor_parallel_size."""
    size = tensor_parallel_size
    weights = weight_bytes(shape, dtype, quantization, group_size, lm_head_quantization, size)
    free = memory_bytes - weights - headroom_bytes
    return Plan(
        weight_bytes=weights,
        kv_bytes_per_token=kv_bytes_per_token(shape, dtype, kv_cache_dtype, size),
        kv_cache_bytes=int(free * kv_fraction) if free > 0 else free,
        max_model_len=max_model_len,
        tensor_parallel_size=size,
    )
