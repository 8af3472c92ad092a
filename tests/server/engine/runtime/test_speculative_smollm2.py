"""Speculative decoding with the real lookup on the bundled model, whose continuation of a text
that repeats itself copies it: greedy int4 output as without drafts, and sampled tokens
distributed as without drafts (a chi-square test of homogeneity, with the power to see a
verification that accepts too much)."""

import json

import pytest
import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.runtime import llm_engine
from kvpilot_server.outputs import Sample

pytestmark = pytest.mark.slow
MiB = 1 << 20
SPECULATIVE = {"speculative": "ngram", "speculative_disable_by_batch_size": 64}


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    outputs = llm.generate(prompts, params)
    assert llm.engine.stats().kv_cache_usage == 0.0
    return [o.outputs[0].token_ids for o in outputs]


def test_greedy_int4_output_is_the_same_with_drafts(corpus_ids):
    """One request at a time, so that every step, drafted or not, stays within the rows the
    same CPU kernels serve (the default of 3 draft tokens makes 4 rows): beyond them other
    kernels round differently, and quantized output depends on the batch with drafts or not."""
    prompts = [corpus_ids[i : i + 120 + 10 * i] for i in range(0, 40, 8)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    args = {"kv_cache_bytes": 64 * MiB, "max_model_len": 1024, "quantization": "int4"}
    plain, llm = LLM(**args), LLM(**args, **SPECULATIVE)
    for prompt in prompts:
        assert _tokens(llm, [prompt], params) == _tokens(plain, [prompt], params)
    counts = llm.engine.stats().speculation
    assert counts.accepted_tokens > counts.draft_tokens // 2, counts  # it copies the corpus


N = 160  # samples per arm
POSITIONS = 8


def _sampled(llm: LLM, prompt: list[int]) -> list[list[int]]:
    params = SamplingParams(max_tokens=POSITIONS, temperature=1.0, ignore_eos=True)
    return _tokens(llm, [prompt] * N, params)


def _homogeneity_p(a: list[int], b: list[int]) -> float:
    """The p-value of Pearson's chi-square test that a and b come from one distribution: a 2 x k
    table of token counts, tokens seen fewer than 10 times in all pooled into one column."""
    tokens = sorted(set(a) | set(b))
    counts = torch.tensor([[a.count(t), b.count(t)] for t in tokens], dtype=torch.float64)
    rare = counts.sum(1) < 10
    table = torch.cat([counts[~rare], counts[rare].sum(0, keepdim=True)])
    table = table[table.sum(1) > 0]
    if len(table) < 2:
        return 1.0
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    df = torch.tensor(len(table) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, statistic / 2))  # chi2's survival function


def _worst_p(x: list[list[int]], y: list[list[int]]) -> float:
    return min(_homogeneity_p([s[k] for s in x], [s[k] for s in y]) for k in range(1, POSITIONS))


def test_sampled_tokens_are_distributed_as_without_drafts(corpus_ids, monkeypatch):
    prompt = corpus_ids[:213]  # the corpus (173 tokens), then the start of its repetition
    args = {"kv_cache_bytes": 64 * MiB, "max_model_len": 512, "max_num_seqs": 64}
    plain = _sampled(LLM(**args, seed=1), prompt)
    llm = LLM(**args, seed=2, **SPECULATIVE)
    drafted = _sampled(llm, prompt)
    counts = llm.engine.stats().speculation
    assert counts.accepted_tokens > N, counts  # verification ran and accepted often
    # Each position's tokens (the first is never drafted), at a fixed seed set: deterministic.
    p_drafted = _worst_p(plain, drafted)
    assert p_drafted > 0.001, p_drafted

    # The test can fail: a verification that accepts every draft is seen at once.
    def accept_all(sampler, logits, seq, draft) -> list[Sample]:
        (bonus,) = sampler.sample(logits[-1:], [seq])
        return [Sample(t) for t in draft] + [bonus]

    # The same drafting engine, its generator further on: the engine looks verify up at each
    # step, and a third engine would only load the model again (a second or more of the test).
    monkeypatch.setattr(llm_engine.speculative, "verify", accept_all)
    greedy = _sampled(llm, prompt)
    p_wrong = _worst_p(plain, greedy)
    print(json.dumps({"p_drafted": p_drafted, "p_accept_all": p_wrong, **vars(counts)}))
    assert p_wrong < 0.001, p_wrong
