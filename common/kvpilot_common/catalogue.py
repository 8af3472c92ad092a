"""The models kvpilot knows by source, so that `kvpilot plan` and the operator's fit check work
before anything is downloaded (and the CRD's CEL rule knows their tensor-parallel sizes: a test
holds the two equal). Standard library only: the operator imports it.

Not every catalogued model is one the engine serves (precision.ARCHITECTURES says which): those
are here so that plans can be made for them, and so that the operator refuses them by name
before any pod (memory_model.unserved), rather than a pod failing at load.
"""

from kvpilot_common.memory_model import ModelShape, shape_from_config
from kvpilot_common.naming import BUNDLED_MODEL


def _dense(
    architecture: str,
    params: int,
    hidden: int,
    layers: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    tied: bool,
    max_position: int,
    heads: int,
) -> ModelShape:
    """A dense model's shape as a literal: every parameter is active."""
    return ModelShape(
        params, hidden, layers, kv_heads, head_dim, vocab, tied, max_position, heads,
        architecture=architecture, active_params=params,
    )  # fmt: skip


# The fields of each model's config.json that the memory model reads (and model_type, for the
# test that builds each one with transformers and counts its parameters), as published.
# gpt-oss ships its experts in MXFP4 (4.25 bits a weight); plans count them at --quantization.
CONFIGS: dict[str, dict] = {
    "hf://Qwen/Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    "hf://mistralai/Mixtral-8x7B-Instruct-v0.1": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "hf://openai/gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "quantization_config": {"quant_method": "mxfp4"},  # as released: experts in MXFP4
    },
    "hf://openai/gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "quantization_config": {"quant_method": "mxfp4"},
    },
    # Multimodal: the language model's fields are under text_config.
    "hf://google/gemma-3-27b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_hidden_layers": 62,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "vocab_size": 262208,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": True,
        },
    },
    "hf://microsoft/phi-4": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 5120,
        "intermediate_size": 17920,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 10,
        "vocab_size": 100352,
        "max_position_embeddings": 16384,
        "tie_word_embeddings": False,
    },
}

KNOWN_MODELS: dict[str, ModelShape] = {
    BUNDLED_MODEL: _dense("LlamaForCausalLM", 134_515_008, 576, 30, 3, 64, 49152, True, 8192, 9),
    "hf://Qwen/Qwen2.5-0.5B-Instruct": _dense(
        "Qwen2ForCausalLM", 494_032_768, 896, 24, 2, 64, 151936, True, 32768, 14
    ),
    "hf://Qwen/Qwen2.5-7B-Instruct": _dense(
        "Qwen2ForCausalLM", 7_615_616_512, 3584, 28, 4, 128, 152064, False, 32768, 28
    ),
    "hf://Qwen/Qwen3-8B": _dense(
        "Qwen3ForCausalLM", 8_190_735_360, 4096, 36, 8, 128, 151936, False, 40960, 32
    ),
    "hf://meta-llama/Llama-3.1-8B-Instruct": _dense(
        "LlamaForCausalLM", 8_030_261_248, 4096, 32, 8, 128, 128256, False, 131072, 32
    ),
    "hf://meta-llama/Llama-3.1-70B-Instruct": _dense(
        "LlamaForCausalLM", 70_553_706_496, 8192, 80, 8, 128, 128256, False, 131072, 64
    ),
    "hf://mistralai/Mistral-7B-Instruct-v0.3": _dense(
        "MistralForCausalLM", 7_248_023_552, 4096, 32, 8, 128, 32768, False, 32768, 32
    ),
    **{source: shape_from_config(config) for source, config in CONFIGS.items()},
}
