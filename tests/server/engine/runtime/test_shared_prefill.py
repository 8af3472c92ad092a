"""n choices of one prompt cost one prefill: identical prompts admitted together wait for the one
being prefilled and take its blocks from the prefix cache, and each choice stays exact."""

from collections.abc import Mapping

import pytest

from kvpilot_common import batch_limits
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.scheduler import Scheduler
from kvpilot_server.engine.runtime.sequence import Sequence

MiB = 1 << 20
BLOCK = 16
LENGTH = 200  # not a multiple of BLOCK: each later choice computes the last, partial block
N = 4


def _scheduler(prefix_caching: bool = True, **cfg) -> Scheduler:
    config = EngineConfig(block_size=4, enable_prefix_caching=prefix_caching, **cfg)
    config.settle_limits(batch_limits.CPU)  # as the engine does once it knows the device
    return Scheduler(config, BlockPool(64, 4, prefix_caching))


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", list(tokens), SamplingParams(), 64)


def _step(sched: Scheduler) -> Mapping[Sequence, int]:
    scheduled = sched.schedule()
    batch = scheduled.num_new_tokens
    done = [s for s, n in batch.items() if s.num_computed_tokens + n == len(s)]
    sched.update(scheduled, {s: [0] for s in done})
    return batch


def test_twins_wait_for_the_prefill_while_other_prompts_pass_them():
    sched = _scheduler()
    first, *twins = [_seq(range(10)) for _ in range(N)]
    other = _seq(range(100, 106))
    for seq in [first, *twins, other]:
        sched.add(seq)
    assert _step(sched) == {first: 10, other: 6}
    # The prompt's two full blocks are keyed: each twin computes only its last, partial block.
    assert _step(sched) == {first: 1, other: 1, **{t: 2 for t in twins}}
    assert all(t.num_cached_tokens == 8 for t in twins)
    assert sched.num_prefill_tokens == 10 + 6 + 3 * 2


def test_twins_wait_through_a_chunked_prefill():
    sched = _scheduler(max_num_batched_tokens=6)
    first, twin = _seq(range(15)), _seq(range(15))
    sched.add(first)
    sched.add(twin)
    # Held while a block it could reuse is still to come, then it fills what budget is left.
    steps = [_step(sched) for _ in range(3)]
    assert steps == [{first: 6}, {first: 6}, {first: 3, twin: 3}]
    assert twin.num_cached_tokens == 12


def test_without_prefix_caching_nothing_is_held_back():
    sched = _scheduler(prefix_caching=False)
    seqs = [_seq(range(10)) for _ in range(N)]
    for seq in seqs:
        sched.add(seq)
    assert _step(sched) == {s: 10 for s in seqs}
    assert sched.num_prefill_tokens == N * 10


@pytest.fixture
def prompt(corpus_ids) -> list[int]:
    return corpus_ids[17 : 17 + LENGTH]


def _choices(llm: LLM, prompt: list[int], params: list[SamplingParams]) -> tuple[list, int]:
    """Outputs of the choices and the prompt tokens the engine computed for them."""
    before = llm.engine.stats().num_prefill_tokens
    outputs = llm.generate([prompt] * len(params), params)
    return [o.outputs[0].token_ids for o in outputs], llm.engine.stats().num_prefill_tokens - before


def test_greedy_choices_cost_one_prefill_and_match_hf(tiny_dir, prompt, hf_greedy):
    path = tiny_dir("llama")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, dtype="float32")
    tokens, computed = _choices(llm, prompt, [SamplingParams(max_tokens=20, temperature=0)] * N)
    assert tokens == [hf_greedy(path, prompt, 20)] * N
    assert computed == LENGTH + (N - 1) * (LENGTH % BLOCK)
    _assert_all_free(llm)


def test_without_prefix_caching_choices_prefill_each_and_match_hf(tiny_dir, prompt, hf_greedy):
    path = tiny_dir("llama")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, enable_prefix_caching=False, dtype="float32")
    tokens, computed = _choices(llm, prompt, [SamplingParams(max_tokens=12, temperature=0)] * N)
    assert tokens == [hf_greedy(path, prompt, 12)] * N
    assert computed == N * LENGTH


def test_seeded_choices_sample_as_each_would_alone(tiny_llm, prompt):
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=7 + i) for i in range(N)]
    tokens, computed = _choices(tiny_llm, prompt, params)
    assert computed <= LENGTH + (N - 1) * BLOCK
    alone = [tiny_llm.generate(prompt, p)[0].outputs[0].token_ids for p in params]
    assert tokens == alone and len({tuple(t) for t in tokens}) > 1


def test_aborting_a_held_choice_or_all_frees_every_block(tiny_llm, prompt):
    engine = tiny_llm.engine
    for i in range(N):
        engine.add_request(f"c{i}", prompt, SamplingParams(max_tokens=30))
    engine.step()  # c0 prefills, the others are held back
    assert engine.scheduler.num_waiting() == N - 1
    engine.abort_request("c2")
    engine.step()
    engine.step()
    engine.abort_request("c0")  # the choice whose prefill the others reuse
    while engine.has_unfinished_requests():
        engine.step()
        engine.abort_request("c3")
    _assert_all_free(tiny_llm)


def test_choices_survive_preemption_and_match_hf(tiny_dir, prompt, hf_greedy):
    path = tiny_dir("llama")
    # 18 blocks: the shared prompt takes 12, too few are left for four tails: preemptions.
    llm = LLM(
        str(path), kv_cache_bytes=_bytes_for_tokens(path, 288), max_model_len=256, dtype="float32"
    )
    tokens, _ = _choices(llm, prompt, [SamplingParams(max_tokens=50, temperature=0)] * N)
    assert tokens == [hf_greedy(path, prompt, 50)] * N
    assert llm.engine.scheduler.num_preemptions > 0
    _assert_all_free(llm)


def _bytes_for_tokens(path, tokens: int) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4 * tokens


def _assert_all_free(llm: LLM) -> None:
    pool = llm.engine.pool
    assert pool.num_free == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)
    assert not llm.engine.scheduler.running and llm.engine.scheduler.num_waiting() == 0
