"""Phi-3 beyond the every-architecture equality tests of test_equivalence_tiny.py: int8 weights
against Hugging Face running the same int8 weights, and longrope in both its regimes (the rule:
model_config.rope_tables)."""

import dataclasses
import random

import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.models.loader import load_hf_config
from kvpilot_server.engine.models.model_config import ModelConfig, rope_tables
from kvpilot_testing.hf_reference import hf_greedy_of, int8_reference

MiB = 1 << 20
SHORT = 128  # phi3-longrope's original_max_position_embeddings (kvpilot_testing.tiny)


def _prompts(corpus_ids: list[int], lengths: list[int]) -> list[list[int]]:
    rng = random.Random(11)
    return [corpus_ids[(start := rng.randrange(0, 800)) : start + n] for n in lengths]


def _check(llm: LLM, prompts, max_tokens: int, expected) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        assert out.outputs[0].token_ids == expected(prompt), f"prompt len {len(prompt)}"


def test_int8_matches_hf_on_the_same_int8_weights(tiny_dir, corpus_ids):
    """The fused qkv and gate/up rows are quantized as transformers' fused rows are."""
    path = tiny_dir("phi3")
    llm = LLM(str(path), quantization="int8", kv_cache_bytes=16 * MiB, dtype="float32")
    reference = int8_reference(path)
    prompts = _prompts(corpus_ids, [3, 40, 120, 17])
    _check(llm, prompts, 16, lambda prompt: reference.greedy(prompt, 16))


def test_longrope_within_the_original_length_is_the_short_factor(tiny_dir, corpus_ids, hf_greedy):
    """max_model_len <= original_max_position_embeddings: no position passes it, transformers
    never leaves the short factor, and neither does the engine."""
    path = tiny_dir("phi3-longrope")
    llm = LLM(
        str(path),
        kv_cache_bytes=16 * MiB,
        max_model_len=SHORT,
        max_num_batched_tokens=32,
        dtype="float32",
    )
    cfg = llm.engine.model.cfg
    assert torch.equal(llm.engine.runner.cos, rope_tables(_with(cfg, cfg.inv_freq), SHORT)[0])
    prompts = _prompts(corpus_ids, [5, 40, 90, 100])
    _check(llm, prompts, 28, lambda prompt: hf_greedy(path, prompt, 28))


def test_longrope_past_the_original_length_is_the_long_factor(tiny_dir, corpus_ids, hf_greedy):
    """A longer max_model_len: the long factor for every position. A prompt already past
    original_max_position_embeddings is then exactly transformers (which switches to the long
    factor for the whole sequence); a shorter one gets the long factor too, which transformers
    would give it only once it passed that length."""
    path = tiny_dir("phi3-longrope")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, max_num_batched_tokens=48, dtype="float32")
    cfg = llm.engine.model.cfg
    assert llm.engine.max_model_len == cfg.max_position_embeddings > SHORT
    long_cos = rope_tables(_with(cfg, cfg.long_inv_freq), cfg.max_position_embeddings)[0]
    assert torch.equal(llm.engine.runner.cos, long_cos)
    _check(llm, _prompts(corpus_ids, [129, 200, 310]), 24, lambda p: hf_greedy(path, p, 24))
    # transformers held to its long factor at every length agrees on the short prompts as well.
    reference = _hf_long_factor_always(path)
    _check(llm, _prompts(corpus_ids, [5, 60]), 24, lambda p: hf_greedy_of(reference, p, 24))


def test_the_long_factor_starts_one_past_the_original_length(tiny_dir):
    cfg = ModelConfig.from_hf(load_hf_config(tiny_dir("phi3-longrope")))
    assert cfg.short_rope_len == SHORT and not torch.equal(cfg.inv_freq, cfg.long_inv_freq)
    short, long = _with(cfg, cfg.inv_freq), _with(cfg, cfg.long_inv_freq)
    assert torch.equal(rope_tables(cfg, SHORT)[1], rope_tables(short, SHORT)[1])
    assert torch.equal(rope_tables(cfg, SHORT + 1)[1], rope_tables(long, SHORT + 1)[1])


def _with(cfg: ModelConfig, inv_freq: torch.Tensor) -> ModelConfig:
    """cfg with one set of frequencies and no longrope switch."""
    return dataclasses.replace(cfg, inv_freq=inv_freq, long_inv_freq=None, short_rope_len=None)


def _hf_long_factor_always(path):
    """transformers' Phi-3 with its short frequencies replaced by the long ones."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rotary = model.model.rotary_emb
    rotary.original_inv_freq.copy_(ModelConfig.from_hf(model.config).long_inv_freq)
    return model
