"""The memory model against what the engine really allocates (CPU, float32, float or int8 KV
cache), its shapes against Hugging Face's own parameter counts, and `kvpilot plan` as users
run it."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvpilot_common.memory_model import (
    KNOWN_MODELS,
    kv_bytes_per_token,
    shape_from_config,
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


def test_known_smollm2_shape_matches_its_config(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert shape_from_config(config) == KNOWN_MODELS["builtin://smollm2-135m-instruct"]


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_predicted_weights_and_kv_match_what_the_engine_allocates(smollm2, kv_cache_dtype):
    llm = LLM(
        str(smollm2), max_model_len=1024, kv_cache_bytes=256 << 20, kv_cache_dtype=kv_cache_dtype
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


def _plan(*args: str) -> tuple[int, dict]:
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", "plan", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_plan_says_what_fits():
    code, big = _plan("--model", "hf://meta-llama/Llama-3.1-70B-Instruct", "--gpu-type", "L4")
    assert code == 1 and not big["fits"] and big["weights_mib"] > 23034
    code, small = _plan("--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4")
    assert code == 0 and small["fits"]
    _, quantized = _plan(
        "--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4", "--quantization", "int8"
    )
    _, kv8 = _plan(
        "--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4", "--kv-cache-dtype", "int8"
    )
    assert quantized["weights_mib"] < 0.6 * small["weights_mib"]
    assert quantized["kv_cache_tokens"] > small["kv_cache_tokens"]
    # Sequences per GiB roughly double against bfloat16; the int8 scales cost 3% at head_dim 128.
    assert 1.9 < small["kv_bytes_per_token"] / kv8["kv_bytes_per_token"] < 2


def test_plan_splits_a_model_across_gpus():
    seventy = ("--model", "hf://meta-llama/Llama-3.1-70B-Instruct", "--gpu-type", "L4")
    int4 = ("--quantization", "int4", "--max-model-len", "8192")
    code, one = _plan(*seventy, *int4)
    assert code == 1 and not one["fits"]
    code, four = _plan(*seventy, *int4, "--tensor-parallel-size", "4")
    assert code == 0 and four["fits"] and four["tensor_parallel_size"] == 4
    # The decoder splits four ways, the embedding and lm_head (4008 MiB in bfloat16) do not.
    embeddings = 2 * 128256 * 8192 * 2 // (1 << 20)
    assert four["weights_mib"] == pytest.approx(
        (one["weights_mib"] - embeddings) / 4 + embeddings, abs=2
    )
    assert four["kv_bytes_per_token"] * 4 == one["kv_bytes_per_token"]  # 8 KV heads, 2 per GPU
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpilot_common.cli",
            "plan",
            *seventy,
            "--tensor-parallel-size",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "size 3 does not divide the model's 64 attention heads" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("quantization", "group"), [("int8", 32), ("int4", 32), ("int4", 64)])
def test_quantized_weights_are_predicted_too(smollm2, quantization, group):
    llm = LLM(
        str(smollm2),
        max_model_len=512,
        kv_cache_bytes=64 << 20,
        quantization=quantization,
        quantization_group_size=group,
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
    llm = LLM(str(path), kv_cache_bytes=16 << 20, lm_head_quantization="int8")
    tensors = [*llm.engine.model.parameters(), *llm.engine.model.buffers()]
    measured = sum({t.data_ptr(): t.nbytes for t in tensors}.values())
    shape = shape_from_config(json.loads((path / "config.json").read_text()))
    assert weight_bytes(shape, "float32", lm_head_quantization="int8") == measured
    # Tied: one int8 table for lm_head and the embedding; untied: the embedding stays float32.
    saved = weight_bytes(shape, "float32") - measured
    table = shape.vocab * shape.hidden
    assert saved == table * 3 - shape.vocab * 4


def test_plan_counts_an_int8_lm_head():
    args = ["--model", "builtin://smollm2-135m-instruct", "--dtype", "float32"]
    _, full = _plan(*args, "--quantization", "int4")
    _, head = _plan(*args, "--quantization", "int4", "--lm-head-quantization", "int8")
    # SmolLM2's tied 49,152 x 576 table: 108 MiB in float32, 27 MiB in int8 (plus its scales;
    # each figure is rounded down to whole MiB).
    assert 80 <= full["weights_mib"] - head["weights_mib"] <= 81
