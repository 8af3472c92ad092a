"""After any workload, aborts and failed steps included, every block is free and cached
prefixes still hit."""

import itertools
import random

import pytest

from kvpilot_common.errors import StepFailedError
from kvpilot_server import LLM, SamplingParams


def _assert_all_free(llm: LLM) -> None:
    pool = llm.engine.pool
    assert pool.num_free == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)
    assert not llm.engine.scheduler.running and llm.engine.scheduler.num_waiting() == 0


def test_mixed_workload_with_aborts_frees_every_block(tiny_llm, corpus_ids):
    engine, rng = tiny_llm.engine, random.Random(3)
    shared = corpus_ids[:64]
    for i in range(24):
        prompt = shared + corpus_ids[100 + i : 100 + i + rng.randrange(1, 120)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=rng.randrange(1, 40)))
    aborted, steps = set(), 0
    while engine.has_unfinished_requests() and steps < 500:
        engine.step()
        steps += 1
        if steps % 3 == 0:  # abort a running request, then a waiting one
            victim = next(iter(engine.requests), None)
            if victim is not None:
                engine.abort_request(victim)
                aborted.add(victim)
    assert aborted and not engine.has_unfinished_requests()
    _assert_all_free(tiny_llm)
    # The shared prefix survived in the free queue and is served from the cache again.
    out = tiny_llm.generate([*shared, 42], SamplingParams(max_tokens=2))[0]
    assert out.num_cached_tokens == 64
    _assert_all_free(tiny_llm)


def test_abort_of_a_waiting_request_and_unknown_id(tiny_llm):
    engine = tiny_llm.engine
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5))
    final = engine.abort_request("a")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert engine.abort_request("a") is None and engine.abort_request("never") is None
    _assert_all_free(tiny_llm)


def test_a_failed_step_raises_from_generate_and_frees_every_block(tiny_dir, corpus_ids):
    llm = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 << 20, max_num_seqs=4)
    engine, run, calls = llm.engine, llm.engine.runner.run, itertools.count()

    def failing_third_step(batch):
        if next(calls) == 2:  # prompts prefilled, decodes running, more requests waiting
            raise ValueError("device lost")
        return run(batch)

    engine.runner.run = failing_third_step
    prompts = [corpus_ids[i : i + 30] for i in range(0, 300, 30)]
    with pytest.raises(StepFailedError, match="device lost") as caught:
        llm.generate(prompts, SamplingParams(max_tokens=16))
    assert isinstance(caught.value, RuntimeError)
    assert isinstance(caught.value.__cause__, ValueError)
    assert not engine.has_unfinished_requests()
    _assert_all_free(llm)
    # The engine serves on.
    assert len(llm.generate(prompts[0], SamplingParams(max_tokens=4))[0].outputs[0].token_ids) == 4
