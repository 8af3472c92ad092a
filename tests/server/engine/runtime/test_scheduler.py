"""Scheduler: token budget, chunked prefill, sequence cap, preemption, interactive before batch."""

import dataclasses
from collections.abc import Mapping

import pytest

from kvpilot_common import batch_limits
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.scheduler import Scheduler
from kvpilot_server.engine.runtime.sequence import Priority, Sequence, SequenceStatus
from kvpilot_server.sampling_params import SamplingParams


def _scheduler(num_blocks=64, block_size=4, **cfg) -> Scheduler:
    config = EngineConfig(block_size=block_size, **cfg)
    config.settle_limits(batch_limits.CPU)  # as the engine does once it knows the device
    return Scheduler(config, BlockPool(num_blocks, block_size))


def _seq(n: int, priority=Priority.INTERACTIVE, start: int = 0) -> Sequence:
    return Sequence(f"r{start}", list(range(start, start + n)), SamplingParams(), 64, priority)


def _step(sched: Scheduler) -> Mapping[Sequence, int]:
    """Schedule, then pretend the model ran and sampled token 0 wherever it reached the end."""
    scheduled = sched.schedule()
    batch = scheduled.num_new_tokens
    done = [s for s, n in batch.items() if s.num_computed_tokens + n == len(s)]
    sched.update(scheduled, {s: [0] for s in done})
    return batch


def test_update_counts_computed_tokens_keys_full_blocks_and_appends_samples():
    sched = _scheduler(max_num_batched_tokens=6)
    seq = _seq(10)
    sched.add(seq)
    scheduled = sched.schedule()
    sched.update(scheduled, {})  # a prefill chunk: nothing sampled
    assert seq.num_computed_tokens == 6 and len(seq) == 10 and seq.num_keyed_blocks == 1
    scheduled = sched.schedule()
    sched.update(scheduled, {seq: [42]})
    assert seq.num_computed_tokens == 10 and seq.token_ids[-1] == 42 and seq.num_keyed_blocks == 2
    # The keyed blocks serve a later request with the same prefix.
    twin = _seq(10)
    sched.add(twin)
    scheduled = sched.schedule()
    assert scheduled.num_new_tokens == {seq: 1, twin: 2} and twin.num_cached_tokens == 8


def test_the_schedule_is_read_only():
    sched = _scheduler()
    seq = _seq(4)
    sched.add(seq)
    scheduled = sched.schedule()
    with pytest.raises(TypeError):
        scheduled.num_new_tokens[seq] = 1  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        scheduled.num_new_tokens = {}  # type: ignore[misc]


def test_long_prompt_is_prefilled_in_chunks_within_budget():
    sched = _scheduler(max_num_batched_tokens=10)
    seq = _seq(25)
    sched.add(seq)
    assert [_step(sched)[seq] for _ in range(3)] == [10, 10, 5]
    assert _step(sched)[seq] == 1  # then decodes


def test_running_decodes_come_before_new_prefills():
    sched = _scheduler(max_num_batched_tokens=8)
    a = _seq(4)
    sched.add(a)
    _step(sched)
    b = _seq(20, start=100)
    sched.add(b)
    assert _step(sched) == {a: 1, b: 7}


def test_sequence_cap_holds_back_waiting_requests():
    sched = _scheduler(max_num_seqs=2)
    seqs = [_seq(3, start=10 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert set(_step(sched)) == set(seqs[:2]) and sched.num_waiting() == 1


def test_batch_work_only_fills_what_interactive_work_leaves():
    sched = _scheduler(max_num_batched_tokens=10)
    batch_seq, chat = _seq(8, Priority.BATCH), _seq(8, start=50)
    sched.add(batch_seq)
    sched.add(chat)
    assert _step(sched) == {chat: 8, batch_seq: 2}


def test_interactive_request_evicts_running_batch_work():
    sched = _scheduler(max_num_seqs=1)
    batch_seq = _seq(4, Priority.BATCH)
    sched.add(batch_seq)
    _step(sched)
    chat = _seq(4, start=50)
    sched.add(chat)
    _step(sched)  # the decode of batch_seq is scheduled, then evicted for chat
    assert chat.status is SequenceStatus.RUNNING
    assert batch_seq.status is SequenceStatus.WAITING and batch_seq.num_preemptions == 1
    assert batch_seq.block_table == [] and batch_seq.num_computed_tokens == 0


def test_out_of_blocks_preempts_the_latest_request():
    sched = _scheduler(num_blocks=4, block_size=2)
    early, late = _seq(4), _seq(4, start=50)
    sched.add(early)
    sched.add(late)
    _step(sched)  # both prompts fill the pool exactly
    assert sched.pool.num_free == 0
    batch = _step(sched)  # early needs a third block for its next token
    assert early in batch and late not in batch
    assert late.status is SequenceStatus.WAITING and sched.num_preemptions == 1
