"""Speculative decoding (engine/runtime/speculative.py): the lookup itself, and verification that
keeps exactly what a run without drafts generates.

A tiny model's random weights never continue their own text, so prompt lookup finds nothing to
accept there. To drive every path of verification (all of a draft accepted, a part, none) the
tiny-model tests give the scheduler a proposer that knows the plain run's answer and spoils it
at chosen places; the bundled model's tests (test_speculative_smollm2.py) use the real lookup.
"""

import dataclasses

import pytest

from kvpilot_common.errors import ConfigError
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.runtime.speculative import NgramProposer
from kvpilot_server.lora_request import LoRARequest
from kvpilot_testing.lora import AdapterSpec, build_adapter

MiB = 1 << 20


def test_the_lookup_proposes_what_followed_the_latest_match_of_the_longest_suffix():
    proposer = NgramProposer(num_tokens=3, lookup_max=3, lookup_min=1)
    #        0  1  2  3  4  5  6  7  8  9 10
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 5, 6, 7]
    # The 3-token suffix [5, 6, 7] occurs at 0: what followed it.
    assert proposer.propose(tokens, 10) == [8, 9, 1]
    # Only [6, 7] occurs before (twice): what followed the latest, [2, 4, 6].
    assert proposer.propose([*tokens[:-3], 4, 6, 7], 10) == [2, 4, 6]
    assert proposer.propose(tokens, 2) == [8, 9]  # the caller's limit
    assert proposer.propose(tokens, 0) == []
    # The follower may run into the suffix itself, up to the end of the text.
    assert proposer.propose([3, 4, 3, 4, 3], 10) == [4, 3]
    assert proposer.propose([1, 2, 3, 4], 10) == []  # nothing occurs twice
    # A single-token suffix is ignored when the shortest lookup is two.
    longer = NgramProposer(num_tokens=3, lookup_max=3, lookup_min=2)
    assert longer.propose([1, 9, 8, 2, 9], 10) == []
    assert proposer.propose([1, 9, 8, 2, 9], 10) == [8, 2, 9]


def test_bad_settings_are_refused_at_start():
    for bad in (
        {"speculative": "eagle"},
        {"num_speculative_tokens": 0},
        {"prompt_lookup_min": 3, "prompt_lookup_max": 2},
        {"prompt_lookup_min": 0},
        {"speculative_disable_by_batch_size": 0},
    ):
        with pytest.raises(ConfigError):
            LLM(kv_cache_bytes=MiB, **bad, dtype="float32")


@dataclasses.dataclass
class Oracle:
    """Proposes the reference run's next tokens for each prompt, wrong at every `spoil`-th draft
    position (counting across all proposals), so steps accept whole drafts, parts and none."""

    answers: dict[tuple[int, ...], list[int]]
    num_tokens: int = 4
    spoil: int = 5
    proposed: int = 0

    def propose(self, token_ids: list[int], limit: int) -> list[int]:
        for prompt, answer in self.answers.items():
            if tuple(token_ids[: len(prompt)]) == prompt:
                done = len(token_ids) - len(prompt)
                draft = answer[done : done + min(self.num_tokens, limit)]
                break
        else:
            return []
        spoiled = []
        for token in draft:
            self.proposed += 1
            spoiled.append(token if self.proposed % self.spoil else (token + 1) % 1000)
        return spoiled


def _run(llm, prompts, params, oracle=None):
    if oracle is not None:
        llm.engine.scheduler.proposer = oracle
    outputs = llm.generate(prompts, params)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.stats().kv_cache_usage == 0.0  # no block left behind
    return [o.outputs[0] for o in outputs]


@pytest.mark.parametrize(
    "engine_args",
    [
        pytest.param({}, id="plain"),
        pytest.param({"max_num_batched_tokens": 24}, id="chunked-prefill"),
        pytest.param({"kv_cache_bytes": 3 * MiB // 8, "max_model_len": 256}, id="preemption"),
        pytest.param({"enable_prefix_caching": False}, id="no-prefix-cache"),
    ],
)
def test_greedy_output_with_drafts_is_the_plain_output(tiny_dir, corpus_ids, engine_args):
    path = str(tiny_dir("llama"))
    prompts = [corpus_ids[i : i + 20 + 3 * i] for i in range(0, 48, 6)]  # two share a prefix
    prompts.append(corpus_ids[:20])
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    args = {"kv_cache_bytes": 16 * MiB, **engine_args}
    plain = _run(LLM(path, **args, dtype="float32"), prompts, params)
    oracle = Oracle({tuple(p): o.token_ids for p, o in zip(prompts, plain, strict=True)})
    llm = LLM(path, speculative="ngram", **args, dtype="float32")
    drafted = _run(llm, prompts, params, oracle)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert [o.text for o in drafted] == [o.text for o in plain]
    counts = llm.engine.stats().speculation
    assert 0 < counts.accepted_tokens < counts.draft_tokens
    if "kv_cache_bytes" in engine_args:
        assert llm.engine.scheduler.num_preemptions > 0


def test_seeded_sampling_with_penalties_and_logprobs_draws_the_plain_tokens(tiny_dir, corpus_ids):
    """Each position is sampled as a plain step samples it (the seed and the output position
    pick the draw; the penalties see the accepted drafts), so a seeded request draws the very
    tokens it draws without drafts, with the same logprobs."""
    path = str(tiny_dir("llama"))
    prompts = [corpus_ids[i : i + 25] for i in range(0, 100, 25)]
    params = [
        SamplingParams(
            max_tokens=20,
            temperature=0.9,
            top_p=0.9,
            seed=i,
            presence_penalty=0.5,
            repetition_penalty=1.3,
            min_tokens=6,
            logprobs=2,
        )
        for i in range(len(prompts))
    ]
    plain = _run(LLM(path, kv_cache_bytes=16 * MiB, dtype="float32"), prompts, params)
    oracle = Oracle({tuple(p): o.token_ids for p, o in zip(prompts, plain, strict=True)})
    llm = LLM(path, kv_cache_bytes=16 * MiB, speculative="ngram", dtype="float32")
    drafted = _run(llm, prompts, params, oracle)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    for got, want in zip(drafted, plain, strict=True):
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]
    assert llm.engine.stats().speculation.accepted_tokens > 0


def test_a_stop_inside_an_accepted_draft_ends_the_output_there(tiny_dir, corpus_ids):
    """A stop string, a stop token or the token budget reached inside a draft: the tokens
    accepted after it are dropped, exactly as if they had never been proposed."""
    path = str(tiny_dir("llama"))
    prompt = corpus_ids[:30]
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = _run(LLM(path, kv_cache_bytes=16 * MiB, dtype="float32"), [prompt], greedy)[0]
    text = full.text
    cases = [
        dataclasses.replace(greedy, stop=[text[len(text) // 2 : len(text) // 2 + 3]]),
        dataclasses.replace(greedy, stop_token_ids=[full.token_ids[13]]),
        dataclasses.replace(greedy, max_tokens=11),
    ]
    plain = _run(LLM(path, kv_cache_bytes=16 * MiB, dtype="float32"), [prompt] * 3, cases)
    # Never spoiled: every draft is accepted whole, so each stop falls inside one.
    oracle = Oracle({tuple(prompt): full.token_ids}, num_tokens=6, spoil=10**9)
    drafted = _run(
        LLM(path, kv_cache_bytes=16 * MiB, speculative="ngram", dtype="float32"),
        [prompt] * 3,
        cases,
        oracle,
    )
    for got, want in zip(drafted, plain, strict=True):
        assert (got.token_ids, got.text) == (want.token_ids, want.text)
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)
    assert [o.finish_reason for o in plain] == ["stop", "stop", "length"]


def test_no_drafts_while_more_sequences_run_than_the_limit(tiny_dir, corpus_ids):
    path = str(tiny_dir("llama"))
    prompts = [corpus_ids[i : i + 20] for i in range(0, 60, 20)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain = _run(LLM(path, kv_cache_bytes=16 * MiB, dtype="float32"), prompts, params)
    oracle = Oracle({tuple(p): o.token_ids for p, o in zip(prompts, plain, strict=True)})
    llm = LLM(
        path,
        kv_cache_bytes=16 * MiB,
        speculative="ngram",
        speculative_disable_by_batch_size=2,
        dtype="float32",
    )
    assert [o.token_ids for o in _run(llm, prompts, params, oracle)] == [o.token_ids for o in plain]
    assert llm.engine.stats().speculation.drafts == 0
    # The same with room for three: drafts.
    llm = LLM(
        path,
        kv_cache_bytes=16 * MiB,
        speculative="ngram",
        speculative_disable_by_batch_size=3,
        dtype="float32",
    )
    assert [o.token_ids for o in _run(llm, prompts, params, oracle)] == [o.token_ids for o in plain]
    assert llm.engine.stats().speculation.drafts > 0


def test_an_adapters_output_is_the_same_with_drafts(tiny_dir, corpus_ids, tmp_path):
    """A drafted sequence's positions each read its LoRA adapter's slot, beside the base
    model's rows in the same step."""
    path = tiny_dir("llama")
    adapter = build_adapter(
        path, tmp_path / "tone", AdapterSpec(rank=4, targets=("q_proj", "v_proj"), seed=5)
    )
    prompts = [corpus_ids[i : i + 24] for i in range(0, 72, 24)]
    requests = [LoRARequest("tone", 1, str(adapter)), None, LoRARequest("tone", 1, str(adapter))]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    args = {"kv_cache_bytes": 16 * MiB, "enable_lora": True, "max_lora_rank": 8}

    def run(llm, oracle=None):
        if oracle is not None:
            llm.engine.scheduler.proposer = oracle
        outputs = llm.generate(prompts, params, lora_request=requests)
        assert llm.engine.stats().kv_cache_usage == 0.0
        return [o.outputs[0].token_ids for o in outputs]

    plain = run(LLM(str(path), **args, dtype="float32"))
    oracle = Oracle({tuple(p): t for p, t in zip(prompts, plain, strict=True)})
    llm = LLM(str(path), speculative="ngram", **args, dtype="float32")
    assert run(llm, oracle) == plain
    assert llm.engine.stats().speculation.accepted_tokens > 0


def test_two_tensor_parallel_ranks_with_drafts_match_hf(tiny_dir, corpus_ids, hf_greedy):
    """Rank 0 plans the drafted positions as decodes; the other rank runs the same plan."""
    path = tiny_dir("llama")
    prompts = [corpus_ids[i : i + 30] for i in range(0, 90, 30)]
    expected = [hf_greedy(path, p, 12) for p in prompts]
    llm = LLM(
        str(path),
        tensor_parallel_size=2,
        kv_cache_bytes=4 * MiB,
        speculative="ngram",
        dtype="float32",
    )
    try:
        llm.engine.scheduler.proposer = Oracle(
            {tuple(p): t for p, t in zip(prompts, expected, strict=True)}
        )
        outputs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0))
        assert [o.outputs[0].token_ids for o in outputs] == expected
        assert llm.engine.stats().speculation.accepted_tokens > 0
    finally:
        llm.engine.close()


def test_blocks_filled_by_accepted_drafts_serve_a_later_prompt_from_the_prefix_cache(
    tiny_dir, corpus_ids
):
    """A block is keyed by the tokens whose K/V it holds, accepted draft tokens among them: the
    conversation's next turn finds every full block of prompt and answer in the cache."""
    path = str(tiny_dir("llama"))
    prompt = corpus_ids[:21]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    answer = _run(LLM(path, kv_cache_bytes=16 * MiB, dtype="float32"), [prompt], params)[
        0
    ].token_ids
    llm = LLM(path, kv_cache_bytes=16 * MiB, speculative="ngram", dtype="float32")
    oracle = Oracle({tuple(prompt): answer}, spoil=10**9)
    assert _run(llm, [prompt], params, oracle)[0].token_ids == answer
    assert llm.engine.stats().speculation.accepted_tokens > 16  # drafts crossed blocks
    both = prompt + answer[:-1]  # computed: the last token never was
    llm.engine.scheduler.proposer = None
    again = llm.generate([both], SamplingParams(max_tokens=1))[0]
    assert again.num_cached_tokens == (len(both) - 1) // 16 * 16
