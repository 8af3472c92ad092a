"""The precision rules, as data: which model dtypes, weight quantizations, int4 group sizes and KV
cache dtypes exist, how the command line and the CRD spell them, what each costs in bytes, what
GPU fp8 needs, and the quirks of the Llama-family architectures the engine implements.

The one source of these rules: the engine (config, quant, kv_cache, model_config), the memory
model, `kvpilot plan`, `kvpilot eval` and the operator (fit, engine_flags) import them, and
tests/test_precision.py holds the CRD's enums and defaults equal to them. Standard library only:
the operator imports this module and carries no torch.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, TypeVar

# -- spellings --------------------------------------------------------------------------------


class _Named(Protocol):
    @property
    def name(self) -> str: ...  # the engine's, CLI's and Python API's spelling (vLLM's)

    @property
    def crd(self) -> str: ...  # spec.engine's spelling: Kubernetes enums are CamelCase


T = TypeVar("T", bound=_Named)


def _table(*rows: T) -> Mapping[str, T]:
    """Rows by name, read-only, in the order given (the CRD lists its enums in this order)."""
    return MappingProxyType({row.name: row for row in rows})


def by_crd(table: Mapping[str, T]) -> Mapping[str, T]:
    """The same rows by their CRD spelling: the operator reads spec.engine with it."""
    return MappingProxyType({row.crd: row for row in table.values()})


# -- model dtype (weights and activations) ----------------------------------------------------


@dataclass(frozen=True)
class DType:
    name: str  # also the torch attribute: getattr(torch, name)
    crd: str
    bytes: int | None  # per element; None: auto, resolved once the device is known


DTYPES = _table(
    DType("auto", "Auto", None),
    DType("float32", "Float32", 4),
    DType("bfloat16", "BFloat16", 2),
    DType("float16", "Float16", 2),
)
DEFAULT_DTYPE = "auto"
# What auto resolves to. CPU: bfloat16 where the CPU multiplies bfloat16 matrices in hardware
# (AMX): there bfloat16 means bfloat16 matrices in a float32 model (engine/layers/half_matrices.py),
# several times faster than float32 products at a small quality cost (`kvpilot eval`'s `none` row
# against its float32 baseline). Without AMX the same products are hundreds of times slower, so
# float32 stays, the dtype whose greedy output equals Hugging Face's (the tests' oracle, which is
# why they name float32). GPUs run 16-bit at full speed with half the memory.
AUTO_DTYPE_CPU = "float32"
AUTO_DTYPE_CPU_AMX = "bfloat16"
AUTO_DTYPE_GPU = "bfloat16"
# Dtypes with a size: `kvpilot plan` needs one, it knows no device to resolve auto on.
SIZED_DTYPES = tuple(name for name, dtype in DTYPES.items() if dtype.bytes)


def resolve_dtype(name: str, gpu: bool, amx: bool = False) -> str:
    """The dtype a model runs in: `name`, or for auto the device's. Sizing that knows no CPU (the
    operator's fit check) leaves `amx` False and counts float32: the larger count unless a tied
    lm_head's own bfloat16 copy outweighs the decoder's saving (a large vocabulary on a small
    model)."""
    if name != "auto":
        return name
    if gpu:
        return AUTO_DTYPE_GPU
    return AUTO_DTYPE_CPU_AMX if amx else AUTO_DTYPE_CPU


# -- fp8 --------------------------------------------------------------------------------------

# Ada (8.9) and Hopper (9.0) are the first GPUs with fp8 tensor cores (torch._scaled_mm) and a
# native float8 conversion; older GPUs and CPUs refuse fp8 weights and fp8 KV caches at start.
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)
FP8_MIN_COMPUTE_CAPABILITY_TEXT = "{}.{}".format(*FP8_MIN_COMPUTE_CAPABILITY)


def fp8_capable(capability: tuple[int, int] | None) -> bool:
    """Whether a device of this compute capability (None: a CPU) runs fp8."""
    return capability is not None and tuple(capability) >= FP8_MIN_COMPUTE_CAPABILITY


# -- weight quantization ----------------------------------------------------------------------


@dataclass(frozen=True)
class Quantization:
    name: str
    crd: str
    bytes_per_weight: float | None  # None: unquantized, the model dtype's size
    bytes_per_group: int = 0  # int4's float16 scale and float16 minimum per group of weights
    fp8: bool = False  # needs a GPU of FP8_MIN_COMPUTE_CAPABILITY

    @property
    def grouped(self) -> bool:
        """Whether weights share scales in groups of a chosen size (INT4_GROUP_SIZES)."""
        return self.bytes_per_group > 0


QUANTIZATIONS = _table(
    Quantization("none", "None", None),
    Quantization("int8", "Int8", 1.0),  # symmetric, a float32 scale per output channel
    Quantization("int4", "Int4", 0.5, bytes_per_group=2 * 2),  # two weights a byte
    Quantization("fp8", "FP8", 1.0, fp8=True),  # e4m3, a float32 scale per output channel
)
DEFAULT_QUANTIZATION = "none"
# int4 only: weights sharing one scale and minimum. 32 by default: llama.cpp's Q4 block size, so
# a model converted from such a GGUF (the bundled one is Q4_1) is reproduced exactly; 64 and 128
# are smaller and lose more. Each must divide the layers' input sizes (checked at load).
INT4_GROUP_SIZES = (32, 64, 128)
INT4_DEFAULT_GROUP_SIZE = 32


def bytes_per_weight(quantization: str, dtype_bytes: int, group_size: int) -> float:
    """Bytes one weight of a quantized linear layer takes, its share of group scales included."""
    q = QUANTIZATIONS[quantization]
    per_weight = q.bytes_per_weight or dtype_bytes
    return per_weight + q.bytes_per_group / group_size if q.grouped else per_weight


# -- lm_head (and tied embeddings) ------------------------------------------------------------

# The vocabulary projection's own option: int8 per output row (quantize_int8's format). With
# tied embeddings (SmolLM2, Qwen2.5-0.5B) one int8 table serves lm_head and the embedding lookup;
# untied, only lm_head is quantized and the embedding stays exact. Any device and dtype: the AVX2
# kernel serves CPU float32 decode batches, elsewhere rows are expanded a chunk at a time.
LM_HEAD_QUANTIZATIONS = _table(QUANTIZATIONS["none"], QUANTIZATIONS["int8"])
DEFAULT_LM_HEAD_QUANTIZATION = "none"  # float output stays equal to Hugging Face's
LM_HEAD_SCALE_BYTES = 4  # a float32 scale per vocabulary row


def lm_head_bytes(quantization: str, vocab: int, hidden: int, tied: bool, dtype_bytes: int) -> int:
    """Bytes of lm_head and the embedding table together, by the lm_head quantization."""
    full = vocab * hidden * dtype_bytes
    q = LM_HEAD_QUANTIZATIONS[quantization]
    if q.bytes_per_weight is None:
        return full if tied else 2 * full
    head = int(vocab * hidden * q.bytes_per_weight) + vocab * LM_HEAD_SCALE_BYTES
    return head if tied else head + full  # untied: the embedding keeps the model dtype


# -- KV cache ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheDtype:
    name: str
    crd: str
    bytes_per_element: int | None  # None: auto, the model dtype's size
    storage: str | None  # the torch dtype the cache is stored in; None: the model dtype
    fp8: bool = False


KV_CACHE_DTYPES = _table(
    KVCacheDtype("auto", "Auto", None, None),
    KVCacheDtype("int8", "Int8", 1, "int8"),
    KVCacheDtype("fp8", "FP8", 1, "float8_e4m3fn", fp8=True),
)
DEFAULT_KV_CACHE_DTYPE = "auto"
# A quantized KV cache keeps a float32 scale per token per kv head, for K and for V: quantized
# once as it is written, no calibration, and one outlier token costs no other token precision.
KV_SCALE_BYTES = 4


def kv_bytes_per_head(head_dim: int, kv_cache_dtype: str, dtype_bytes: int) -> int:
    """Bytes one token's K (or V) takes in one kv head, its scale included."""
    element = KV_CACHE_DTYPES[kv_cache_dtype].bytes_per_element
    if element is None:
        return head_dim * dtype_bytes
    return head_dim * element + KV_SCALE_BYTES


# -- architectures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    # Qwen2's attention always has q, k and v biases and never an o bias (transformers' Qwen2
    # ignores attention_bias); the others put a bias on all four exactly when attention_bias.
    fixed_qkv_bias: bool = False
    # Qwen3 normalizes each head's q and k (an RMSNorm of head_dim weights each) before rope.
    qk_norm: bool = False
    # A mixture of experts: some or all layers route each token to top-k of many MLPs
    # (engine/layers/moe.py); the config's expert fields say how many and how wide.
    moe: bool = False
    # Gemma 2 caps attention logits (tanh(x / cap) * cap, its attn_logit_softcapping); transformers'
    # Gemma 3 has the config field too but never applies it.
    attention_softcap: bool = False
    # gpt-oss: a learned logit per attention head joins each softmax (an "attention sink": it
    # takes probability mass and adds no value).
    attention_sinks: bool = False
    # Pre-quantized checkpoint formats (config.json's quantization_config.quant_method) the
    # engine reads for this architecture, dequantizing at load (engine/models/mxfp4.py).
    checkpoint_quantizations: tuple[str, ...] = ()


# Keyed by the class name in config.json's "architectures", not by its "model_type": the class
# is what the checkpoint's weights were saved from, so it fixes the layout, and it is the name
# the engine refuses an unsupported checkpoint by. All share Llama's attention block; the
# mixtures of experts replace its MLP.
ARCHITECTURES = MappingProxyType(
    {
        "LlamaForCausalLM": Architecture(),
        "MistralForCausalLM": Architecture(),
        "Qwen2ForCausalLM": Architecture(fixed_qkv_bias=True),
        "Qwen3ForCausalLM": Architecture(qk_norm=True),
        "MixtralForCausalLM": Architecture(moe=True),
        "Qwen2MoeForCausalLM": Architecture(fixed_qkv_bias=True, moe=True),
        "Qwen3MoeForCausalLM": Architecture(qk_norm=True, moe=True),
        # Gemma 2 and Gemma 3's text model (engine/models/gemma.py): four norms a layer, each
        # scaling by 1 + weight, gelu gates, alternating sliding and full attention layers.
        "Gemma2ForCausalLM": Architecture(attention_softcap=True),
        "Gemma3ForCausalLM": Architecture(qk_norm=True),
        # Phi-3 and Phi-4: their checkpoints store q/k/v and gate/up fused (models/phi3.py).
        "Phi3ForCausalLM": Architecture(),
        # gpt-oss (engine/models/gpt_oss.py): biases on q/k/v/o, attention sinks, alternating
        # sliding and full layers; every layer a mixture of experts whose router and experts
        # have biases, routed top-k first, with a clamped SwiGLU. The released checkpoints store
        # the experts in MXFP4, which the loader dequantizes.
        "GptOssForCausalLM": Architecture(
            moe=True, attention_sinks=True, checkpoint_quantizations=("mxfp4",)
        ),
    }
)


@dataclass(frozen=True)
class Layout:
    """Which optional tensors a decoder layer has."""

    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool


def checkpoint_quantization(quantization_config: object) -> str | None:
    """The method a pre-quantized checkpoint names (config.json's `quantization_config`, a dict
    or transformers' object), "unnamed" if it names none, or None for float weights."""
    if not quantization_config:
        return None
    if isinstance(quantization_config, Mapping):
        method = quantization_config.get("quant_method")
    else:
        method = getattr(quantization_config, "quant_method", None)
    return str(method or "unnamed")


def prequantized_problem(quantization_config: object, architecture: str) -> str | None:
    """Why the engine refuses a checkpoint stored pre-quantized, or None: float weights, or a
    format the architecture's loader reads (gpt-oss's MXFP4 experts)."""
    method = checkpoint_quantization(quantization_config)
    if method is None:
        return None
    readable = ARCHITECTURES.get(architecture, Architecture()).checkpoint_quantizations
    if method in readable:
        return None
    return (
        f"pre-quantized checkpoints are not supported (quantization_config: {method}): "
        "kvpilot loads float weights (float32, bfloat16, float16), and gpt-oss's MXFP4 "
        "experts, and quantizes them itself (--quantization); use a dequantized copy of this "
        "model"
    )


def architecture_name(config: Mapping) -> str:
    """The architecture a config.json (a plain dict) names, or "<none>". A base model saved
    without its language-model head (`Qwen3Model`, as embedding checkpoints are) is named by
    its causal-LM class: the decoder is the same."""
    name = (config.get("architectures") or ["<none>"])[0]
    causal = name.removesuffix("Model") + "ForCausalLM"
    return causal if name.endswith("Model") and causal in ARCHITECTURES else name


def layout(architecture: str, attention_bias: bool, mlp_bias: bool) -> Layout:
    """A decoder layer's optional tensors, from the architecture and the config's two flags.
    An architecture the engine does not implement (the memory model may still be asked about
    one) is taken to be plain Llama."""
    quirks = ARCHITECTURES.get(architecture, Architecture())
    if quirks.fixed_qkv_bias:
        qkv, o = True, False
    else:
        qkv = o = bool(attention_bias)
    return Layout(qkv_bias=qkv, o_bias=o, mlp_bias=bool(mlp_bias), qk_norm=quirks.qk_norm)
