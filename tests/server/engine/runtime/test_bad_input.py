"""Bad input raises a specific, clear exception and leaves the engine serving others."""

import json

import pytest
from safetensors.torch import save_file

from kvpilot_common.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidRequestError,
    ModelLoadError,
    UnsupportedArchitectureError,
)
from kvpilot_server import LLM, SamplingParams


def test_prompt_longer_than_context_is_rejected_and_others_finish(tiny_dir, corpus_ids):
    llm = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 << 20, max_model_len=128)
    engine = llm.engine
    engine.add_request("ok", corpus_ids[:20], SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    with pytest.raises(ContextOverflowError, match="maximum context length is 128 tokens") as e:
        engine.add_request("long", corpus_ids[:200], SamplingParams(max_tokens=8))
    assert e.value.prompt_tokens == 200 and e.value.max_tokens == 8
    with pytest.raises(ContextOverflowError, match=r"requested 148 tokens \(120 in the prompt"):
        engine.add_request("long2", corpus_ids[:120], SamplingParams(max_tokens=28))
    while engine.has_unfinished_requests():
        outputs = engine.step()
    assert outputs[0].request_id == "ok" and len(outputs[0].outputs[0].token_ids) == 8
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"temperature": -1.0}, "temperature must be non-negative"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must not exceed max_tokens"),
        ({"seed": 2**64}, "seed must fit in 64 bits"),
    ],
)
def test_invalid_sampling_params(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        SamplingParams(**kwargs)
    assert e.value.param == next(iter(kwargs)) or e.value.param == "min_tokens"


def test_invalid_prompts(tiny_llm):
    engine = tiny_llm.engine
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("e", [], SamplingParams())
    with pytest.raises(InvalidRequestError, match="integers in"):
        engine.add_request("v", [1, 10**9], SamplingParams())
    engine.add_request("dup", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("dup", [1, 2], SamplingParams())


def test_unknown_architecture_lists_supported_ones(tiny_dir, tmp_path):
    model = _copy(tiny_dir("llama"), tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"GPTNeoXForCausalLM.*Qwen3ForCausalLM"):
        LLM(str(model), kv_cache_bytes=1 << 20)


def test_partial_rotary_is_refused_by_name(tiny_dir, tmp_path):
    """Phi-4-mini rotates 3/4 of each head; the engine rotates whole heads and says so rather
    than rotate the rest as well."""
    model = _copy(tiny_dir("phi3"), tmp_path)
    config = json.loads((model / "config.json").read_text())
    del config["rope_parameters"]  # Phi-4-mini's config.json spells it as transformers 4 did
    config.update(partial_rotary_factor=0.75, rope_theta=10000.0)
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"partial_rotary_factor 0.75 is not supported"):
        LLM(str(model), kv_cache_bytes=1 << 20)


def test_missing_model_path():
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM("/nonexistent/model/dir")


def test_corrupted_safetensors(tiny_dir, tmp_path):
    model = _copy(tiny_dir("llama"), tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"Cannot read weights from .*model.safetensors"):
        LLM(str(model), kv_cache_bytes=1 << 20)


def test_missing_weights_are_named(tiny_dir, tmp_path):
    model = _copy(tiny_dir("llama"), tmp_path)
    save_file({"model.norm.weight": __import__("torch").ones(64)}, model / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing weights: embed_tokens\.weight"):
        LLM(str(model), kv_cache_bytes=1 << 20)


def test_cache_too_small_for_one_sequence_fails_at_start(tiny_dir):
    with pytest.raises(ConfigError, match="fewer than one sequence of max_model_len 1024"):
        LLM(str(tiny_dir("llama")), kv_cache_bytes=1 << 16)


def _copy(src, tmp_path):
    import shutil

    return shutil.copytree(src, tmp_path / "model")


@pytest.mark.parametrize(
    ("device", "message"), [("cuda", "no usable CUDA"), ("tpu", "Unknown device 'tpu'")]
)
def test_unavailable_device_fails_at_start(tiny_dir, device, message):
    with pytest.raises(ConfigError, match=message):
        LLM(str(tiny_dir("llama")), device=device)


def test_invalid_engine_config_fails_at_start(tiny_dir):
    with pytest.raises(ConfigError, match="block_size must be at least 1"):
        LLM(str(tiny_dir("llama")), block_size=0)
    with pytest.raises(ConfigError, match="exceeds the model's limit of 1024"):
        LLM(str(tiny_dir("llama")), max_model_len=4096)
