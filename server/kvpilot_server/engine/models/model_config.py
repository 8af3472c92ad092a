"""The handful of numbers kvpilot's Llama-family implementation needs, read from an HF config."""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from kvpilot_common import precision
from kvpilot_common.errors import ModelLoadError, UnsupportedArchitectureError
from kvpilot_common.experts import Experts, from_config

# Rope types whose frequencies do not depend on the sequence length at run time.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


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

    @classmethod
    def from_hf(cls, hf: PretrainedConfig) -> "ModelConfig":
        arch = precision.architecture_name({"architectures": getattr(hf, "architectures", None)})
        if arch not in precision.ARCHITECTURES:
            raise UnsupportedArchitectureError(arch, list(precision.ARCHITECTURES))
        layout = precision.layout(
            arch, getattr(hf, "attention_bias", False), getattr(hf, "mlp_bias", False)
        )
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        inv_freq, scaling = _rope(hf, head_dim)
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
            eos_token_ids=[e for e in eos if e is not None],
            experts=from_config(hf.to_dict()),
        )


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
    if rope_type == "default":
        # Same arithmetic as transformers' default rope, so positions encode bit for bit alike.
        base = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (base**exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    return inv_freq.float(), float(scaling if scaling is not None else 1.0)


def rope_tables(cfg: ModelConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position below max_len: [max_len, head_dim] each."""
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), cfg.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * cfg.rope_scaling, emb.sin() * cfg.rope_scaling
