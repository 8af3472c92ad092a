"""Greedy output equals Hugging Face generate() token for token, for every tiny architecture."""

import random

import pytest

from kvpilot_server import LLM, SamplingParams

MiB = 1 << 20


def _prompts(corpus_ids: list[int], lengths: list[int]) -> list[list[int]]:
    rng = random.Random(7)
    return [corpus_ids[(start := rng.randrange(0, 500)) : start + n] for n in lengths]


def _check(llm: LLM, path, prompts, max_tokens, hf_greedy) -> None:
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in max_tokens]
    outputs = llm.generate(prompts, params)
    for prompt, out, m in zip(prompts, outputs, max_tokens, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(path, prompt, m), f"prompt len {len(prompt)}"


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_concurrent_requests_match_hf(tiny_model, corpus_ids, hf_greedy, block_size):
    llm = LLM(str(tiny_model), block_size=block_size, kv_cache_bytes=64 * MiB, dtype="float32")
    lengths = [1, 2, 15, 16, 17, 31, 33, 64, 100, 150, 200, 250, 299, 300, 7, 90]
    _check(
        llm,
        tiny_model,
        _prompts(corpus_ids, lengths),
        [5 + (i * 7) % 30 for i in range(16)],
        hf_greedy,
    )


def test_chunked_prefill_matches_hf(tiny_model, corpus_ids, hf_greedy):
    llm = LLM(str(tiny_model), max_num_batched_tokens=24, kv_cache_bytes=64 * MiB, dtype="float32")
    _check(llm, tiny_model, _prompts(corpus_ids, [100, 57, 3, 250]), [12, 20, 8, 16], hf_greedy)


def test_prefix_cache_hits_match_hf(tiny_model, corpus_ids, hf_greedy):
    llm = LLM(str(tiny_model), kv_cache_bytes=64 * MiB, dtype="float32")
    system = corpus_ids[:80]
    prompts = [system + corpus_ids[200 + 13 * i : 210 + 17 * i] for i in range(6)]
    _check(llm, tiny_model, prompts[:1], [10], hf_greedy)  # fills the cache
    _check(llm, tiny_model, prompts, [10] * 6, hf_greedy)
    assert llm.engine.pool.num_hits >= 5 * 80 // 16 * 16


def test_preemption_matches_hf(tiny_model, corpus_ids, hf_greedy):
    # Room for about one long sequence at a time: the scheduler must preempt and recompute.
    llm = LLM(
        str(tiny_model),
        kv_cache_bytes=_bytes_for_tokens(tiny_model, 400),
        max_model_len=400,
        enable_prefix_caching=False,
        dtype="float32",
    )
    _check(llm, tiny_model, _prompts(corpus_ids, [150, 120, 180, 90]), [60] * 4, hf_greedy)
    assert llm.engine.scheduler.num_preemptions > 0


def _bytes_for_tokens(path, tokens: int) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4 * tokens


def test_reference_attention_path_matches_hf(tiny_dir, corpus_ids, hf_greedy, monkeypatch):
    """Without the compiled kernel the PyTorch reference path serves decodes; it stays exact."""
    monkeypatch.setenv("KVPILOT_CPU_KERNELS", "0")
    for name in ("llama", "mistral-window", "qwen3", "gemma3"):
        path = tiny_dir(name)
        llm = LLM(str(path), kv_cache_bytes=64 * MiB, max_num_batched_tokens=40, dtype="float32")
        assert llm.engine.runner.kernel is None
        lengths = [3, 40, 90, 150, 7, 260]
        _check(llm, path, _prompts(corpus_ids, lengths), [30, 12, 25, 8, 40, 16], hf_greedy)
