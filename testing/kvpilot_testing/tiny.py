"""Tiny random-weight checkpoints, one per supported architecture, for fast exact tests.

Weights come from transformers' own model classes with a fixed seed, saved as safetensors beside
the bundled tokenizer, so kvpilot loads them exactly like a real checkpoint. A large
initializer_range keeps logits far apart, so greedy outputs vary from token to token.
"""

import shutil
from pathlib import Path

TINY_BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
)

# name -> (transformers config class, overrides)
TINY_MODELS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": False}),
    "llama-tied-mha": ("LlamaConfig", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "mistral": ("MistralConfig", {"tie_word_embeddings": False, "sliding_window": None}),
    "mistral-window": ("MistralConfig", {"tie_word_embeddings": False, "sliding_window": 24}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
    # Mixtures of experts: 8 experts, top-2, as the real ones route.
    "mixtral": (
        "MixtralConfig",
        {"tie_word_embeddings": False, "num_local_experts": 8, "sliding_window": None},
    ),
    # A shared expert beside the routed ones; layer 0 kept dense (mlp_only_layers).
    "qwen2-moe": (
        "Qwen2MoeConfig",
        {
            "tie_word_embeddings": False,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 96,
            "mlp_only_layers": [0],
        },
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {
            "tie_word_embeddings": False,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
        },
    ),
    # q/k/v and gate/up stored fused; a sliding window as Phi-3-mini-4k's (2047 of 4096).
    "phi3": ("Phi3Config", {"tie_word_embeddings": False, "sliding_window": 40}),
    # Sliding (window 24) and full layers alternating; a query scale other than head_dim's;
    # attention logits capped at 10 (without the cap these prompts' greedy tokens change) and
    # final logits at 1, about their own size (tests/server/engine/models/test_gemma.py).
    "gemma2": (
        "Gemma2Config",
        {
            "tie_word_embeddings": True,
            "head_dim": 16,
            "query_pre_attn_scalar": 32,
            "sliding_window": 24,
            "attn_logit_softcapping": 10.0,
            "final_logit_softcapping": 1.0,
        },
    ),
    # Gemma 3's text model: q/k norms; the full layer's rope base 1M scaled linearly by 8 (as
    # the 4B-27B models'), the sliding layer's 10k. An attention softcap transformers' Gemma 3
    # never applies (so must kvpilot not).
    "gemma3": (
        "Gemma3TextConfig",
        {
            "tie_word_embeddings": True,
            "head_dim": 32,
            "query_pre_attn_scalar": 24,
            "sliding_window": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            "attn_logit_softcapping": 1.0,
        },
    ),
    # gpt-oss: sliding (window 24) and full layers alternating, attention sinks, yarn rope (as
    # the real model's 4096 x 32, here 256 x 4: this context, some dimensions interpolated and
    # some not), 8 experts top-2, routed top-k first. The SwiGLU's limit is lowered from 7 so
    # that its clamps bite at these activations' size.
    "gpt-oss": (
        "GptOssConfig",
        {
            "tie_word_embeddings": False,
            "head_dim": 16,
            "sliding_window": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "swiglu_limit": 1.5,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 256,
            },
        },
    ),
}
# Gemma's norms scale by 1 + weight and transformers starts every weight at zero: drawn at
# random here, so that a norm computed otherwise (1 dropped, or rounded with w) would show. Its
# embeddings are multiplied by sqrt(hidden_size): at this initializer_range the input token's
# own row would then dominate its tied logits (greedy repeats one token), so the table is
# divided by that factor.
GEMMA_MODELS = ("gemma2", "gemma3")
# transformers starts gpt-oss's attention and expert biases at zero: drawn at random (as
# TINY_PARALLEL_MODELS' are), so that a bias dropped, sliced wrong or added once per rank shows.
RANDOM_BIAS_MODELS = ("gpt-oss",)
# For tensor parallelism (not in TINY_MODELS' every-test matrix): one KV head, fewer than two
# ranks, so it is replicated; biases on every projection, drawn at random (transformers starts
# them at zero), so a row-parallel bias added once per rank instead of once would show.
TINY_PARALLEL_MODELS: dict[str, tuple[str, dict]] = {
    "llama-mqa-bias": (
        "LlamaConfig",
        {
            "tie_word_embeddings": False,
            "num_key_value_heads": 1,
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
}

# longrope (Phi-3-mini-128k, Phi-3.5-mini), for tests/server/engine/models/test_phi3.py: past
# 128 positions transformers switches from short_factor to long_factor, scaled as the 128k
# models' (max_position_embeddings / original_max_position_embeddings: an attention factor).
TINY_LONGROPE_MODELS: dict[str, tuple[str, dict]] = {
    "phi3-longrope": (
        "Phi3Config",
        {
            "tie_word_embeddings": True,
            "original_max_position_embeddings": 128,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
            },
        },
    ),
}

# For the compiled decode stack: inputs (96) not a whole number of int8-activation spans (64),
# so int4 layers take their float-activation kernel.
TINY_ODD_WIDTH_MODELS: dict[str, tuple[str, dict]] = {
    "llama-odd-width": ("LlamaConfig", {"tie_word_embeddings": False, "hidden_size": 96}),
}


def build_tiny_model(name: str, target: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint `name` to target (once) and return target."""
    import torch
    import transformers

    if (target / "config.json").is_file():
        return target
    class_name, overrides = {
        **TINY_MODELS,
        **TINY_PARALLEL_MODELS,
        **TINY_LONGROPE_MODELS,
        **TINY_ODD_WIDTH_MODELS,
    }[name]
    config_class = getattr(transformers, class_name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = config_class(**{**TINY_BASE, **overrides, "vocab_size": len(tokenizer)})
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if name in GEMMA_MODELS:
        with torch.no_grad():
            for key, param in model.named_parameters():
                if "norm." in key:
                    param.normal_(0.0, TINY_BASE["initializer_range"])
            model.get_input_embeddings().weight.div_(config.hidden_size**0.5)
    if name in TINY_PARALLEL_MODELS or name in RANDOM_BIAS_MODELS:
        with torch.no_grad():
            for key, param in model.named_parameters():
                if key.endswith((".bias", "_bias")):  # gpt-oss: experts.gate_up_proj_bias
                    param.normal_(0.0, TINY_BASE["initializer_range"])
    return save_checkpoint(model, target, tokenizer_dir)


def save_checkpoint(model, target: Path, tokenizer_dir: Path) -> Path:
    """A transformers model saved as safetensors beside the tokenizer's files, written to a
    temporary directory and moved into place whole (a half-written target never exists)."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for file in tokenizer_dir.iterdir():
        if file.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(file, tmp / file.name)
    tmp.replace(target)
    return target
