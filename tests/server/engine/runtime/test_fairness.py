"""Token-fair admission (engine/runtime/fairness.py) on the scheduler alone: counters, the lift,
weights, shares of the running sequences, forgetting idle tenants."""

from collections.abc import Mapping

from kvpilot_common import batch_limits
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime import fairness
from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.scheduler import Scheduler
from kvpilot_server.engine.runtime.sequence import Priority, Sequence, Tenant
from kvpilot_server.sampling_params import SamplingParams

A, B, C = Tenant("a"), Tenant("b"), Tenant("c")


def _scheduler(**cfg) -> Scheduler:
    config = EngineConfig(block_size=4, **cfg)
    config.settle_limits(batch_limits.CPU)  # as the engine does once it knows the device
    return Scheduler(config, BlockPool(256, 4, False))


def _seq(tenant: Tenant, n: int = 8, priority=Priority.INTERACTIVE) -> Sequence:
    return Sequence(tenant.name, list(range(n)), SamplingParams(), 64, priority, tenant=tenant)


def _step(sched: Scheduler) -> Mapping[Sequence, int]:
    scheduled = sched.schedule()
    batch = scheduled.num_new_tokens
    done = [s for s, n in batch.items() if s.num_computed_tokens + n == len(s)]
    sched.update(scheduled, {s: [0] for s in done})
    return batch


def _names(batch) -> list[str]:
    return sorted(s.tenant.name for s in batch)


def test_a_newcomer_is_admitted_before_the_backlog_of_a_tenant_served_already():
    sched = _scheduler(max_num_seqs=2)
    backlog = [_seq(A) for _ in range(6)]
    for seq in backlog:
        sched.add(seq)
    late = _seq(B)
    sched.add(late)  # after all of A's
    assert _names(_step(sched)) == ["a", "b"]  # FIFO would run two of A's


def test_counters_grow_by_prompt_and_weighted_output_tokens_over_the_weight():
    sched = _scheduler()
    heavy = Tenant("h", weight=2.0)
    sched.add(_seq(A, 10))
    sched.add(_seq(heavy, 10))
    _step(sched)  # both prefill and sample one token
    expected = 10 * fairness.PROMPT_WEIGHT + fairness.OUTPUT_WEIGHT
    assert sched.waiting.counters == {"a": expected, "h": expected / 2}


def test_an_idle_tenant_is_lifted_to_the_level_of_those_waiting_and_earns_no_credit():
    sched = _scheduler(max_num_seqs=1)
    first = _seq(A)
    sched.add(first)
    for _ in range(5):
        _step(sched)
    sched.add(_seq(A))  # waits behind the running one
    counter_a = sched.waiting.counters["a"]
    sched.add(_seq(B))  # B never ran: it starts at A's level, not at 0
    assert sched.waiting.counters["b"] == counter_a


def test_weights_share_admissions_in_proportion():
    sched = _scheduler(max_num_seqs=1)
    gold = Tenant("gold", weight=3.0)
    for _ in range(12):
        sched.add(_seq(A, 4))
        sched.add(_seq(gold, 4))
    admitted: list[str] = []
    while len(admitted) < 8:
        batch = _step(sched)
        admitted += [s.tenant.name for s, n in batch.items() if s.num_computed_tokens == n]
        for seq in [s for s in sched.running if s.num_output_tokens >= 1]:
            sched.remove(seq)  # one token each: equal cost per request
    assert admitted.count("gold") == 3 * admitted.count("a")


def test_a_tenant_without_a_running_sequence_takes_a_slot_from_the_one_holding_all():
    sched = _scheduler(max_num_seqs=4)
    for _ in range(8):
        sched.add(_seq(A))
    _step(sched)
    assert _names(sched.running) == ["a"] * 4
    sched.add(_seq(B))
    batch = _step(sched)
    assert _names(sched.running) == ["a", "a", "a", "b"] and sched.num_preemptions == 1
    assert sum(1 for s in batch if s.tenant is B) == 1
    sched.add(_seq(C))
    _step(sched)
    assert _names(sched.running) == ["a", "a", "b", "c"]
    # Shares are equal enough: A's next waiting sequence takes nothing back.
    _step(sched)
    assert _names(sched.running) == ["a", "a", "b", "c"] and sched.num_preemptions == 2


def test_no_slot_is_taken_across_classes_or_within_one_tenant():
    sched = _scheduler(max_num_seqs=2)
    for _ in range(4):
        sched.add(_seq(A))
    _step(sched)
    sched.add(_seq(B, priority=Priority.BATCH))  # batch work never preempts interactive work
    _step(sched)
    assert _names(sched.running) == ["a", "a"] and sched.num_preemptions == 0


def test_one_tenant_is_served_in_arrival_order():
    sched = _scheduler(max_num_seqs=2)
    seqs = [_seq(A, 4 + i) for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    order: list[Sequence] = []
    while len(order) < 5:
        batch = _step(sched)
        order += [s for s, n in batch.items() if s.num_computed_tokens == n]
        for seq in list(sched.running):
            sched.remove(seq)
    assert order == seqs and sched.num_preemptions == 0


def test_idle_tenants_are_forgotten_and_finished_ones_leave_no_count():
    sched = _scheduler(max_num_seqs=64)
    for i in range(fairness._PRUNE_EVERY - 1):
        seq = _seq(Tenant(f"t{i}"))
        sched.add(seq)
        _step(sched)
        sched.remove(seq)
    assert not sched.waiting.live
    sched.add(_seq(A))  # the arrival that sweeps: every idle tenant is at or under the level
    # Kept: A, and the last tenant served, whose counter is above the level.
    assert set(sched.waiting.counters) == {"a", f"t{fairness._PRUNE_EVERY - 2}"}


def test_a_slot_taken_back_is_not_readmitted_in_the_same_step_across_classes():
    """Equal counters, and the newcomer's tenant runs more sequences of the other class: the
    victim must stay out for the step, or the two would trade the slot for ever."""
    sched = _scheduler(max_num_seqs=4)
    a1, a2 = _seq(A, priority=Priority.BATCH), _seq(A, priority=Priority.BATCH)
    for seq in (a1, a2, _seq(B), _seq(B)):
        sched.add(seq)
    _step(sched)
    assert sched.waiting.counters["a"] == sched.waiting.counters["b"]
    late = _seq(B, priority=Priority.BATCH)
    sched.add(late)
    batch = _step(sched)
    assert late in batch and a2 not in batch and a2 in sched.waiting
    assert sched.num_preemptions == 1


def test_no_slot_is_taken_for_an_adapter_that_could_not_run():
    class NoSlot:
        def available(self, adapter_id: int) -> bool:
            return False

    sched = _scheduler(max_num_seqs=2)
    sched.lora = NoSlot()  # type: ignore[assignment] - every slot is pinned by other adapters
    for _ in range(3):
        sched.add(_seq(A))
    _step(sched)
    wants = _seq(B)
    wants.adapter = 7
    sched.add(wants)
    _step(sched)
    assert _names(sched.running) == ["a", "a"] and sched.num_preemptions == 0
