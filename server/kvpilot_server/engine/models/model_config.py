"""The handful of numbers kvpilot's Llama-family implementation needs, read from an HF config."""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from kvpilot_common import precision
from kvpilot_common.errors import ModelLoadError, UnsupportedArchitectureError
from kvpilot_common.experts import Experts, from_config

# Rope types whose frequencies do not depend on the sequence length at run time, and longrope,
# whose two sets the engine picks between once, by its max_model_len (rope_tables).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional", "longrope")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    layer_windows: list[int | None]  # sliding window per layer, None: full attention
    inv_freq: torch.Tensor
    rope_scaling: float  # multiplies cos/sin (yarn's attention factor), 1.0 otherwise
    eos_token_ids: list[int]
    experts: Experts | None = None  # a mixture of experts' shape; None: dense
    base_model: bool = False  # saved without lm_head (an embedding checkpoint)
    # longrope (Phi-3, Phi-4-mini): the frequencies past `short_rope_len` (long_factor's), and
    # that length (original_max_position_embeddings); inv_freq is short_factor's. None otherwise.
    long_inv_freq: torch.Tensor | None = None
    short_rope_len: int | None = None
    # Gemma 2 and 3 (models/gemma.py); every other family keeps these defaults.
    activation: str = "silu"  # the MLP gate's: hidden_act (Gemma's hidden_activation)
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar's)
    attn_logit_softcapping: float | None = None  # tanh(logits / cap) * cap before the softmax
    final_logit_softcapping: float | None = None  # the same on the lm_head's logits
    # Sliding-window layers' own rope where the config gives each layer type its own (Gemma 3:
    # base 10k, the full layers' 1M); None: every layer rotates by inv_freq.
    local_inv_freq: torch.Tensor | None = None
    local_rope_scaling: float = 1.0
    # gpt-oss (models/gpt_oss.py): a sink logit per head in each attention softmax, and its
    # experts' clamped SwiGLU as (alpha, limit), in place of hidden_act's silu (which its config
    # names, and transformers' experts do not apply).
    attention_sinks: bool = False
    swiglu: tuple[float, float] | None = None
    # How the checkpoint stores its weights when not as floats: "mxfp4" (gpt-oss's experts,
    # which models/mxfp4.py dequantizes as they are read); None: float tensors.
    checkpoint_quantization: str | None = None

    @property
    def eager_softmax(self) -> bool:
        """Whether attention needs its softmax in eager PyTorch: a logit cap (Gemma 2) or sink
        logits (gpt-oss), which neither the compiled decode kernel nor flash attention has."""
        return self.attn_logit_softcapping is not None or self.attention_sinks

    @classmethod
    def from_hf(cls, hf: PretrainedConfig) -> "ModelConfig":
        arch = precision.architecture_name({"architectures": getattr(hf, "architectures", None)})
        if arch not in precision.ARCHITECTURES:
            raise UnsupportedArchitectureError(arch, list(precision.ARCHITECTURES))
        layout = precision.layout(
            arch, getattr(hf, "attention_bias", False), getattr(hf, "mlp_bias", False)
        )
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        by_type = _layer_type_ropes(hf, head_dim)
        inv_freq, scaling = by_type["full_attention"] if by_type else _rope(hf, head_dim)
        local_inv_freq, local_scaling = by_type["sliding_attention"] if by_type else (None, 1.0)
        long_inv_freq, short_rope_len = _long_rope(hf)
        if getattr(hf, "use_bidirectional_attention", False):  # Gemma 3's embedding variant
            raise ModelLoadError("bidirectional attention (an embedding model) is not supported")
        # Stored pre-quantized: read only where the loader can dequantize (gpt-oss's MXFP4).
        stored = getattr(hf, "quantization_config", None)
        prequantized = precision.prequantized_problem(stored, arch)
        if prequantized:
            raise ModelLoadError(prequantized)
        scalar = getattr(hf, "query_pre_attn_scalar", None)
        # transformers' Gemma 3 keeps attn_logit_softcapping in its config but never applies it.
        quirks = precision.ARCHITECTURES[arch]
        attn_cap = getattr(hf, "attn_logit_softcapping", None) if quirks.attention_softcap else None
        eos = hf.eos_token_id if isinstance(hf.eos_token_id, list) else [hf.eos_token_id]
        return cls(
            architecture=arch,
            base_model=arch != (hf.architectures or [None])[0],
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            max_position_embeddings=hf.max_position_embeddings,
            qkv_bias=layout.qkv_bias,
            o_bias=layout.o_bias,
            mlp_bias=layout.mlp_bias,
            qk_norm=layout.qk_norm,
            tie_word_embeddings=getattr(hf, "tie_word_embeddings", False),
            layer_windows=_windows(hf),
            inv_freq=inv_freq,
            rope_scaling=scaling,
            long_inv_freq=long_inv_freq,
            short_rope_len=short_rope_len,
            activation=getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu"),
            attention_scale=None if scalar is None else scalar**-0.5,
            attn_logit_softcapping=attn_cap,
            final_logit_softcapping=getattr(hf, "final_logit_softcapping", None),
            local_inv_freq=local_inv_freq,
            local_rope_scaling=local_scaling,
            attention_sinks=quirks.attention_sinks,
            swiglu=_swiglu(hf),
            eos_token_ids=[e for e in eos if e is not None],
            experts=from_config(hf.to_dict()),
            checkpoint_quantization=precision.checkpoint_quantization(stored),
        )


def _swiglu(hf: PretrainedConfig) -> tuple[float, float] | None:
    """gpt-oss's (alpha, limit); None for every other family (no swiglu_limit). transformers 4's
    config had no alpha: its code fixed 1.702, as transformers 5's default is."""
    limit = getattr(hf, "swiglu_limit", None)
    if limit is None:
        return None
    return float(getattr(hf, "swiglu_alpha", 1.702)), float(limit)


def _windows(hf: PretrainedConfig) -> list[int | None]:
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is None:
        return [window] * hf.num_hidden_layers
    return [window if t == "sliding_attention" else None for t in layer_types]


def _rope(hf: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    params = getattr(hf, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise ModelLoadError(
            f"rope_type {rope_type!r} is not supported; supported: {', '.join(STATIC_ROPE_TYPES)}"
        )
    # The rotation turns every dimension of the head (llama.rotate); transformers' partial rope
    # turns the first fraction alone (proportional rope's frequencies span the head: zeros).
    partial = params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))
    if partial not in (None, 1.0) and rope_type != "proportional":
        raise ModelLoadError(
            f"partial_rotary_factor {partial} is not supported: kvpilot applies rope to the "
            f"whole head ({head_dim} dimensions), this model to {int(head_dim * partial)}"
        )
    if rope_type == "default":
        # Same arithmetic as transformers' default rope, so positions encode bit for bit alike.
        base = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (base**exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    if inv_freq.numel() * 2 != head_dim:
        raise ModelLoadError(
            f"rope_type {rope_type!r} gives {inv_freq.numel()} frequencies for a head of "
            f"{head_dim} dimensions: kvpilot needs one per pair of dimensions"
        )
    return inv_freq.float(), float(scaling if scaling is not None else 1.0)


def _layer_type_ropes(
    hf: PretrainedConfig, head_dim: int
) -> dict[str, tuple[torch.Tensor, float]] | None:
    """(inv_freq, scaling) of each layer type where rope_parameters is keyed by layer type
    (transformers 5's Gemma 3: the full layers' base 1M, linearly scaled in the larger models,
    and the sliding layers' 10k); None where one rope serves every layer (_rope)."""
    params = getattr(hf, "rope_parameters", None) or {}
    if not isinstance(params.get("full_attention"), dict):
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ropes = {}
    for layer_type in ("full_attention", "sliding_attention"):
        own = params.get(layer_type) or {}
        rope_type = own.get("rope_type", "default")
        if rope_type not in STATIC_ROPE_TYPES or rope_type == "longrope":
            raise ModelLoadError(f"rope_type {rope_type!r} on {layer_type} layers is not supported")
        if rope_type == "default":  # _rope's arithmetic, transformers' too
            exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
            ropes[layer_type] = 1.0 / (own.get("rope_theta", 10000.0) ** exponents), 1.0
            continue
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu", layer_type=layer_type)
        ropes[layer_type] = inv_freq.float(), float(scaling if scaling is not None else 1.0)
    return ropes


def _long_rope(hf: PretrainedConfig) -> tuple[torch.Tensor | None, int | None]:
    """longrope's long_factor frequencies and the length past which transformers uses them
    (original_max_position_embeddings); (None, None) for any other rope. The attention factor is
    one for both sets, `rope_scaling` (_rope)."""
    params = getattr(hf, "rope_parameters", None) or {}
    if params.get("rope_type") != "longrope":
        return None, None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    short_len = params["original_max_position_embeddings"]
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=short_len + 1)
    return long_inv_freq.float(), short_len


def rope_tables(cfg: ModelConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position below max_len (the engine's max_model_len): [max_len,
    head_dim] each.

    longrope: transformers rotates with the short factor while a forward pass's positions stay
    within original_max_position_embeddings and with the long one for every position once they
    pass it, so one sequence changes frequencies as it grows (its cached keys keep the old
    ones). These tables are fixed for the engine's life, so the engine picks once, as vLLM does:
    the short factor when max_len <= original_max_position_embeddings (no sequence passes it:
    exactly transformers), else the long one (exactly transformers for a prompt longer than
    original_max_position_embeddings; a shorter sequence gets the long frequencies where
    transformers would use the short)."""
    inv_freq = cfg.inv_freq
    if cfg.long_inv_freq is not None and max_len > cfg.short_rope_len:
        inv_freq = cfg.long_inv_freq
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * cfg.rope_scaling, emb.sin() * cfg.rope_scaling
    if cfg.local_inv_freq is not None:
        # Gemma 3: the sliding layers' table beside the full layers', [max_len, 2 * head_dim],
        # so that a step still indexes positions once; models/gemma.py splits it.
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), cfg.local_inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = torch.cat((cos, emb.cos() * cfg.local_rope_scaling), dim=-1)
        sin = torch.cat((sin, emb.sin() * cfg.local_rope_scaling), dim=-1)
    return cos, sin
