"""Sampling: seeds independent of the batch, top-k=1 is greedy, stops, penalties, logprobs,
prompt logprobs."""

import pytest
import torch

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server import LLM, SamplingParams


def test_seeded_request_samples_the_same_tokens_whatever_the_batch(tiny_llm, corpus_ids):
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=1234)
    alone = tiny_llm.generate(corpus_ids[:30], params)[0].outputs[0].token_ids
    others = [corpus_ids[i : i + 10 + i] for i in range(1, 9)]
    mixed = tiny_llm.generate(
        [*others[:4], corpus_ids[:30], *others[4:]],
        [SamplingParams(max_tokens=30, temperature=1.3)] * 4
        + [params]
        + [SamplingParams(max_tokens=5, temperature=0.7, seed=9)] * 4,
    )
    assert mixed[4].outputs[0].token_ids == alone
    unseeded = tiny_llm.generate([corpus_ids[:30]] * 3, SamplingParams(max_tokens=24))
    assert len({tuple(o.outputs[0].token_ids) for o in unseeded}) > 1  # sampling is random


def test_top_k_one_equals_greedy(tiny_llm, corpus_ids):
    prompt = corpus_ids[5:45]
    greedy = tiny_llm.generate(prompt, SamplingParams(max_tokens=20, temperature=0.0))[0]
    top1 = tiny_llm.generate(prompt, SamplingParams(max_tokens=20, temperature=1.5, top_k=1))[0]
    assert top1.outputs[0].token_ids == greedy.outputs[0].token_ids


def test_stop_string_spanning_tokens_ends_text_exactly_before_it(tiny_llm, corpus_ids):
    prompt = corpus_ids[:20]
    full = tiny_llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0))[0].outputs[0]
    tokenizer = tiny_llm.tokenizer
    # A stop string made of the end of token 5's text and the start of token 6's.
    piece5 = tokenizer.decode(full.token_ids[5:6])
    piece6 = tokenizer.decode(full.token_ids[6:7])
    stop = piece5[-2:] + piece6[:2]
    assert len(piece5) >= 2 and len(piece6) >= 2
    expected = full.text[: full.text.index(stop)]
    out = tiny_llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0, stop=[stop]))
    assert out[0].outputs[0].text == expected
    assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].stop_reason == stop


def test_stop_token_ids_min_tokens_and_max_tokens(tiny_llm, corpus_ids):
    prompt = corpus_ids[:20]
    full = tiny_llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))[0].outputs[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 12
    stop_id = full.token_ids[3]
    out = tiny_llm.generate(
        prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_id])
    )[0].outputs[0]
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]
    assert out.stop_reason == stop_id
    banned = tiny_llm.generate(
        prompt,
        SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_id], min_tokens=12),
    )[0].outputs[0]
    assert len(banned.token_ids) == 12 and stop_id not in banned.token_ids


def test_penalties_discourage_repeats(tiny_llm, corpus_ids):
    prompt = corpus_ids[:10]
    plain = tiny_llm.generate(prompt, SamplingParams(max_tokens=60, temperature=0.0))[0]
    penalized = tiny_llm.generate(
        prompt,
        SamplingParams(
            max_tokens=60,
            temperature=0.0,
            frequency_penalty=2.0,
            presence_penalty=2.0,
            repetition_penalty=1.5,
        ),
    )[0]
    plain_ids, pen_ids = plain.outputs[0].token_ids, penalized.outputs[0].token_ids
    assert len(set(pen_ids)) > len(set(plain_ids))


def test_logprobs_match_the_models_distribution(tiny_llm, tiny_dir, corpus_ids):
    from transformers import AutoModelForCausalLM

    prompt = corpus_ids[:16]
    out = tiny_llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, logprobs=3))[0]
    sample = out.outputs[0].logprobs[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("llama"), dtype=torch.float32)
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], dim=-1)
    top = torch.topk(expected, 3)
    assert [t for t, _ in sample.top_logprobs] == top.indices.tolist()
    assert sample.token_id == top.indices[0]
    torch.testing.assert_close(sample.logprob, float(top.values[0]), atol=1e-4, rtol=1e-4)


def test_extreme_settings_sample_without_failing_their_neighbours(tiny_llm, corpus_ids):
    # A repetition penalty near 0 turns logits into inf; a tiny temperature means greedy.
    extreme = SamplingParams(max_tokens=6, repetition_penalty=1e-300, seed=1)
    tiny_temperature = SamplingParams(max_tokens=6, temperature=1e-30)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    prompt = corpus_ids[:20]
    outs = tiny_llm.generate([prompt] * 3, [extreme, tiny_temperature, greedy])
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 3
    assert outs[1].outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_prompt_logprobs_match_the_model_through_chunks_and_the_prefix_cache(tiny_dir, corpus_ids):
    from transformers import AutoModelForCausalLM

    # A 40-token budget prefills the 70-token prompts in chunks, three at once.
    llm = LLM(
        str(tiny_dir("llama")), kv_cache_bytes=16 << 20, max_num_batched_tokens=40, dtype="float32"
    )
    prompt = corpus_ids[:70]
    llm.generate(prompt, SamplingParams(max_tokens=1))  # the prompt's blocks are now cached
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
    outputs = llm.generate([prompt] * 3, params)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("llama"), dtype=torch.float32)
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
    for out in outputs:
        found = out.prompt_logprobs
        assert len(found) == len(prompt) and found[0] is None  # as vLLM: nothing predicts token 0
        assert out.num_cached_tokens == 0  # cached tokens would have no logits
        for position, sample in enumerate(found[1:], start=1):
            assert sample.token_id == prompt[position]
            want = float(expected[position - 1, prompt[position]])
            torch.testing.assert_close(sample.logprob, want, atol=1e-4, rtol=1e-4)
            top = torch.topk(expected[position - 1], 2).indices.tolist()
            assert [t for t, _ in sample.top_logprobs] == top
    with pytest.raises(InvalidRequestError, match="prompt_logprobs must be in"):
        SamplingParams(prompt_logprobs=21)
