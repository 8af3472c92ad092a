"""The memory model against what the engine really allocates (CPU, float32, float or int8 KV
cache), and its shapes (mixtures of experts' total and active parameters, the catalogue's real
models) against Hugging Face's own parameter counts. `kvpilot plan`: test_plan.py."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvpilot_common import precision
from kvpilot_common.catalogue import CONFIGS, KNOWN_MODELS
from kvpilot_common.memory_model import (
    kv_bytes_per_token,
    shape_from_config,
    unserved,
    weight_bytes,
)
from kvpilot_server import LLM


def test_shapes_from_config_count_every_parameter(tiny_model):
    config = json.loads((tiny_model / "config.json").read_text())
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # Tied embeddings are one tensor: count unique storages, as memory does.
    unique = {p.data_ptr(): p.numel() for p in hf.parameters()}
    assert shape_from_config(config).params == sum(unique.values())


@pytest.mark.parametrize(
    ("config_class", "flags"),
    [
        ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
        ("Qwen3Config", {"attention_bias": True}),
        ("Qwen2Config", {}),
    ],
)
def test_shapes_count_the_biases_an_architecture_has(config_class, flags):
    """attention_bias puts a bias on o as well as on q, k and v (except in Qwen2, whose biases
    are fixed), mlp_bias one on gate, up and down: the engine builds them (precision.layout),
    and the memory model once counted only q, k and v, keyed by model_type."""
    import transformers

    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=128)
    small |= dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    config = getattr(transformers, config_class)(**small, **flags)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    as_saved = config.to_dict() | {"architectures": [type(hf).__name__]}
    assert shape_from_config(as_saved).params == sum(p.numel() for p in hf.parameters())


def _unused_experts(hf, top_k: int, count: int) -> int:
    """Parameters of the experts one token is not routed to, counted from the model's modules:
    each sparse layer's experts (a module holding all of them) less the top_k it uses."""
    unused = 0
    for layer in hf.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            unused += sum(p.numel() for p in experts.parameters()) * (count - top_k) // count
    return unused


@pytest.mark.parametrize(
    ("config_class", "flags"),
    [
        ("MixtralConfig", {"num_local_experts": 8, "num_experts_per_tok": 2}),
        # Every other layer sparse, a shared expert beside the routed ones, qkv biases.
        (
            "Qwen2MoeConfig",
            {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
            | {"shared_expert_intermediate_size": 80, "decoder_sparse_step": 2},
        ),
        # Layer 0 dense by mlp_only_layers; q and k norms.
        (
            "Qwen3MoeConfig",
            {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32}
            | {"mlp_only_layers": [0], "head_dim": 32},
        ),
    ],
)
def test_mixtures_of_experts_count_every_expert_and_the_active_ones(config_class, flags):
    import transformers

    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, vocab_size=128)
    small |= dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    config = getattr(transformers, config_class)(**small, **flags)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    as_saved = config.to_dict() | {"architectures": [type(hf).__name__]}
    shape = shape_from_config(as_saved)
    total = sum(p.numel() for p in hf.parameters())
    assert shape.params == total
    count = flags.get("num_local_experts") or flags["num_experts"]
    top_k = flags["num_experts_per_tok"]
    unused = _unused_experts(hf, top_k, count)
    assert unused > 0 and shape.active_params == total - unused
    assert (shape.experts.count, shape.experts.top_k) == (count, top_k)


@pytest.mark.parametrize("source", list(CONFIGS))
def test_catalogued_configs_count_what_transformers_builds(source):
    """Each catalogued config.json, built by transformers as the class it names (on the meta
    device: shapes without memory), has the parameters the catalogue says. Gemma 3's vision
    tower and projector are left out on both sides: the memory model counts the language
    model."""
    import transformers

    config = CONFIGS[source]
    built = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        hf = getattr(transformers, config["architectures"][0])(built)
    vision = ("model.vision_tower.", "model.multi_modal_projector.")
    # named_parameters() yields a tied table once.
    language = sum(p.numel() for n, p in hf.named_parameters() if not n.startswith(vision))
    shape = KNOWN_MODELS[source]
    assert shape.params == language
    if shape.experts:
        text = built.get_text_config()
        unused = _unused_experts(hf, text.num_experts_per_tok, shape.experts.count)
        assert shape.active_params == language - unused


# (total, active) parameters in billions as the model cards give them, to one decimal (Qwen
# says 3.3B of its 3.35B). OpenAI counts gpt-oss's active parameters without the embedding
# table, of which a token reads one row: the third figure.
PUBLISHED = {
    "hf://Qwen/Qwen3-30B-A3B": (30.5, 3.3),
    "hf://mistralai/Mixtral-8x7B-Instruct-v0.1": (46.7, 12.9),
    "hf://openai/gpt-oss-20b": (20.9, 4.2, 3.6),
    "hf://openai/gpt-oss-120b": (116.8, 5.7, 5.1),
    "hf://google/gemma-3-27b-it": (27.0, 27.0),
    "hf://microsoft/phi-4": (14.7, 14.7),
}


@pytest.mark.parametrize(("source", "published"), PUBLISHED.items())
def test_the_catalogue_agrees_with_the_model_cards(source, published):
    shape = KNOWN_MODELS[source]
    ours = (shape.params, shape.active_params, shape.active_params - shape.vocab * shape.hidden)
    assert [n / 1e9 for n in ours[: len(published)]] == pytest.approx(published, abs=0.06)


def test_an_architecture_the_engine_does_not_serve_is_named_in_its_words():
    config = {"architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64, "intermediate_size": 96}
    config |= {"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
    said, _, supported = unserved(shape_from_config(config)).partition(" kvpilot supports: ")
    # The engine's own words (errors.UnsupportedArchitectureError), naming what it serves.
    assert said == "Unsupported model architecture 'GPTNeoXForCausalLM'."
    assert supported.rstrip(".").split(", ") == sorted(precision.ARCHITECTURES)
    for shape in KNOWN_MODELS.values():
        served = shape.architecture in precision.ARCHITECTURES and shape.prequantized is None
        assert (unserved(shape) is None) == served


def test_mxfp4_releases_are_served_and_other_stored_forms_refused_in_the_engines_words():
    """gpt-oss's releases store their experts in MXFP4, which the engine reads (planned at the
    serving dtype: the experts are dequantized); a GPTQ copy, or MXFP4 named on another family,
    is refused by plan and the operator in the words the engine would fail to load it with."""
    for source in ("hf://openai/gpt-oss-20b", "hf://openai/gpt-oss-120b"):
        assert KNOWN_MODELS[source].prequantized is None and unserved(KNOWN_MODELS[source]) is None
    gptq = {"quant_method": "gptq", "bits": 4}
    config = {**CONFIGS["hf://openai/gpt-oss-20b"], "quantization_config": gptq}
    shape = shape_from_config(config)
    assert unserved(shape) == precision.prequantized_problem(gptq, "GptOssForCausalLM")
    assert "quantization_config: gptq" in unserved(shape)
    phi = {**CONFIGS["hf://microsoft/phi-4"], "quantization_config": {"quant_method": "mxfp4"}}
    assert "quantization_config: mxfp4" in unserved(shape_from_config(phi))


def test_known_smollm2_shape_matches_its_config(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert shape_from_config(config) == KNOWN_MODELS["builtin://smollm2-135m-instruct"]


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_predicted_weights_and_kv_match_what_the_engine_allocates(smollm2, kv_cache_dtype):
    llm = LLM(
        str(smollm2),
        max_model_len=1024,
        kv_cache_bytes=256 << 20,
        kv_cache_dtype=kv_cache_dtype,
        dtype="float32",
    )
    engine = llm.engine
    shape = KNOWN_MODELS["builtin://smollm2-135m-instruct"]
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in engine.model.parameters()}
    measured_weights = sum(unique.values())
    measured_kv = sum(layer.nbytes for layer in engine.runner.kv_cache)
    slots = engine.pool.num_blocks * engine.config.block_size
    predicted_weights = weight_bytes(shape, "float32")
    predicted_kv = kv_bytes_per_token(shape, "float32", kv_cache_dtype) * slots
    assert predicted_kv == measured_kv  # int8: the scales are counted on both sides
    measured, predicted = measured_weights + measured_kv, predicted_weights + predicted_kv
    print({"measured_bytes": measured, "predicted_bytes": predicted})
    assert abs(predicted - measured) <= 0.10 * measured


@pytest.mark.slow
@pytest.mark.parametrize(("quantization", "group"), [("int8", 32), ("int4", 32), ("int4", 64)])
def test_quantized_weights_are_predicted_too(smollm2, quantization, group):
    llm = LLM(
        str(smollm2),
        max_model_len=512,
        kv_cache_bytes=64 << 20,
        quantization=quantization,
        quantization_group_size=group,
        dtype="float32",
    )
    tensors = [*llm.engine.model.parameters(), *llm.engine.model.buffers()]
    measured = sum({t.data_ptr(): t.nbytes for t in tensors}.values())
    shape = KNOWN_MODELS["builtin://smollm2-135m-instruct"]
    predicted = weight_bytes(shape, "float32", quantization, group)
    print({f"{quantization}_g{group}_measured": measured, "predicted": predicted})
    assert abs(predicted - measured) <= 0.10 * measured


@pytest.mark.parametrize("name", ["llama", "qwen2"])  # untied, tied
def test_an_int8_lm_head_is_counted_as_the_engine_stores_it(tiny_dir, name):
    path = tiny_dir(name)
    llm = LLM(str(path), kv_cache_bytes=16 << 20, lm_head_quantization="int8", dtype="float32")
    tensors = [*llm.engine.model.parameters(), *llm.engine.model.buffers()]
    measured = sum({t.data_ptr(): t.nbytes for t in tensors}.values())
    shape = shape_from_config(json.loads((path / "config.json").read_text()))
    assert weight_bytes(shape, "float32", lm_head_quantization="int8") == measured
    # Tied: one int8 table for lm_head and the embedding; untied: the embedding stays float32.
    saved = weight_bytes(shape, "float32") - measured
    table = shape.vocab * shape.hidden
    assert saved == table * 3 - shape.vocab * 4
