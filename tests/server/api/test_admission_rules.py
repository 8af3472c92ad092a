"""Admission's rules against a given engine snapshot: what counts as waiting, n checked before
admitting, slots given back on every exit, Retry-After spread, the timeout ceiling."""

import pytest

from kvpilot_common.errors import InvalidRequestError, OverloadedError
from kvpilot_server.api.admission import Admission
from kvpilot_server.engine.runtime.llm_engine import EngineStats
from kvpilot_server.engine.runtime.sequence import Priority


def _stats(running: int = 0, waiting: int = 0) -> EngineStats:
    zero = {p: 0 for p in Priority}
    return EngineStats(
        running={**zero, Priority.INTERACTIVE: running},
        waiting={**zero, Priority.INTERACTIVE: waiting},
        kv_cache_usage=0.0,
        num_preemptions=0,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
    )


def _admission(stats: EngineStats, max_waiting: int = 2, seats: int = 4) -> Admission:
    return Admission(max_waiting, request_timeout=None, stats=lambda: stats, max_num_seqs=seats)


def test_a_burst_the_engine_has_seats_for_is_not_refused():
    # Nothing has reached the engine yet: 4 seats free, 2 may wait, so 6 get in and the 7th not.
    admission = _admission(_stats())
    holds = [admission.admit() for _ in range(6)]
    for hold in holds:
        hold.__enter__()
    with pytest.raises(OverloadedError, match="limit 2"):
        admission.admit().__enter__()
    assert admission.in_flight == 6


def test_waiting_is_what_the_engine_queues_plus_what_it_has_not_seen():
    # The engine runs 4 (no seat free) and queues 1; one admitted request has not reached it.
    admission = _admission(_stats(running=4, waiting=1))
    admission.in_flight = 6
    assert admission.waiting_if_admitted(1) == 3
    with pytest.raises(OverloadedError):
        admission.admit().__enter__()


def test_n_is_checked_before_admitting():
    # One place left in the queue: a request with 2 choices does not fit, one with 1 does.
    admission = _admission(_stats(running=4, waiting=1))
    admission.in_flight = 5
    with pytest.raises(OverloadedError):
        admission.admit(2).__enter__()
    with admission.admit(1):
        assert admission.in_flight == 6
    assert admission.in_flight == 5


def test_n_beyond_what_could_ever_be_admitted_is_a_400_not_a_429():
    admission = _admission(_stats(), max_waiting=2, seats=4)
    with pytest.raises(InvalidRequestError, match="max_num_seqs 4 \\+ max_waiting 2") as info:
        admission.admit(7).__enter__()
    assert info.value.param == "n"


def test_slots_come_back_on_every_exit():
    admission = _admission(_stats())
    with pytest.raises(ValueError), admission.admit(3):
        raise ValueError("the handler failed")
    assert admission.in_flight == 0 and len(admission.finished) == 3


def test_refused_clients_are_told_different_retry_times():
    admission = _admission(_stats(running=4, waiting=2))
    delays = set()
    for _ in range(40):
        with pytest.raises(OverloadedError) as info:
            admission.admit().__enter__()
        delays.add(info.value.retry_after)
    assert len(delays) > 1 and all(1 <= d <= 60 for d in delays)


@pytest.mark.parametrize(
    ("server", "requested", "expected"),
    [(5.0, None, 5.0), (5.0, 1.0, 1.0), (5.0, 1e308, 5.0), (None, 2.0, 2.0), (None, None, None)],
)
def test_the_server_timeout_is_a_ceiling(server, requested, expected):
    admission = Admission(4, request_timeout=server)
    assert admission.deadline(requested) == expected


def test_a_full_queue_still_takes_a_tenant_under_its_share_up_to_twice_full():
    admission = _admission(_stats())  # 4 seats, 2 may wait
    holds = [admission.admit(1, "flood") for _ in range(6)]
    for hold in holds:
        hold.__enter__()
    with pytest.raises(OverloadedError):
        admission.admit(1, "flood").__enter__()
    # Another tenant holds nothing of the queue: its share (one of two places) gets it in.
    holds.append(admission.admit(1, "light"))
    holds[-1].__enter__()
    with pytest.raises(OverloadedError):
        admission.admit(1, "light").__enter__()  # its share is used
    holds.append(admission.admit(1, "third"))
    holds[-1].__enter__()  # a third's share rounds up to one place
    with pytest.raises(OverloadedError):
        admission.admit(1, "fourth").__enter__()  # the queue is twice full: no more
    assert admission.in_flight == 8 and admission.tenants == {"flood": 6, "light": 1, "third": 1}
    holds[0].__exit__(None, None, None)
    assert admission.tenants["flood"] == 5
