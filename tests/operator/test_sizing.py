"""decide() sizing from demand: a step of load mapped to a replica count in one decision once a
replica's capacity is learned, the trend projected over the pods' start-up (said in words), a
burst's panic (at once; no scale-down while it lasts), the dead band on ripple, and the memory
surviving a restart through status as JSON."""

import itertools
import json
import math

import pytest

from kvpilot_operator import children, forecast
from kvpilot_operator.decide import Inputs, decide
from kvpilot_operator.forecast import Memory
from kvpilot_testing.autoscale_sim import scaling

FIELDS = {
    "minReplicas": 1,
    "maxReplicas": 30,
    "targetLatencyP95Milliseconds": 1000,
    "windowSeconds": 60,
    "intervalSeconds": 15,
}
SCALING = scaling(**FIELDS, scaleUp={"stabilizationSeconds": 0, "maxStepReplicas": 10})
STEADY = [(float(t), 40.0) for t in range(0, 600, 15)]  # ten minutes of 40 req/s


def seen(
    arrivals: float, current: int = 4, p95: float = 900.0, recent: float | None = None
) -> Inputs:
    return Inputs(
        current=current,
        starting=0,
        pods_scraped=current,
        scrape_failures=0,
        queue_per_replica=0.5,
        p95_ms=p95,
        finished=arrivals * 60,
        arrivals=arrivals,
        recent_arrivals=arrivals if recent is None else recent,
        startup_seconds=62,
    )


def test_capacity_is_learned_from_the_replicas_own_latency():
    # One point: 4 replicas carry 40 req/s at p95 0.9 s, the aim (1 s less 10%): 10 each.
    memory = decide(seen(40.0), SCALING, [], 600.0, Memory(STEADY)).memory
    assert memory.points == [(10.0, 0.9)] and memory.capacity == 10.0
    # At most one point per window: the next step's latency adds nothing yet.
    later = decide(seen(40.0, p95=950), SCALING, [], 615.0, memory).memory
    assert (later.points, later.capacity, later.learned_at) == (memory.points, 10.0, 600.0)


def test_capacity_is_solved_on_a_queueing_curve_not_a_line_through_zero():
    # Replicas that serve 10 req/s, p95 = ln(20) / (10 - load): at 5, 6 and 7 req/s each the
    # ratio is 0.6, 0.75 and 1.0. At the aim (0.9 s) a replica carries 10 - ln(20) / 0.9.
    memory, now = Memory(STEADY), 600.0
    for load in (5.0, 6.0, 7.0):
        p95 = 1000 * math.log(20) / (10 - load)
        memory = decide(seen(4 * load, p95=p95), SCALING, [], now, memory).memory
        now += 60
    assert memory.capacity == pytest.approx(10 - math.log(20) / 0.9)
    # The ray through the origin from the lightest point alone would say 7.5 req/s: too many.
    assert forecast.capacity(memory.points[:1], 0.9) == pytest.approx(5 * 0.9 / (math.log(20) / 5))
    # Far past the target a backlog sets latency, not the load: no point is taken.
    past = decide(seen(40.0, p95=3000.0), SCALING, [], now, memory).memory
    assert past.points == memory.points


def test_a_step_of_load_is_sized_in_one_decision():
    memory = Memory(STEADY, capacity=10.0)
    decision = decide(seen(40.0, p95=3000, recent=95.0), SCALING, [], 600.0, memory)
    # A burst: 95 req/s over the short window against 40 over the window, 10 per replica.
    assert decision.replicas == 10
    assert decision.reason.startswith("burst: arrivals 95.0 req/s over 15s vs 40.0 over 60s")
    assert decision.reason.endswith(": 4 -> 10")
    # While it lasts (a window), quiet metrics scale nothing down.
    calm = decide(seen(40.0, current=10, p95=300), SCALING, [], 630.0, decision.memory)
    assert calm.replicas == 10 and "a burst was seen" in calm.reason


def test_a_rising_trend_is_projected_over_the_start_up_and_said_in_words():
    rising = [(float(t), 20.0 + t / 60) for t in range(0, 600, 15)]  # +1 req/s per minute
    memory = Memory(rising[:-1], capacity=10.0)
    # (p95 0.15 s: too low to say how loaded a replica is; the capacity stays 10 here)
    decision = decide(seen(29.75, 3, 150.0, 29.5), SCALING, [], 585.0, memory)
    # Now ~30 req/s (3 replicas' worth); ready pods serve ~2.1 minutes from the window's middle.
    ahead = 29.75 + 1 / 60 * (30 + 62 + 15)
    assert decision.replicas == math.ceil(ahead / 10) == 4
    assert "arrivals 29.8 req/s rising 1.0 req/s per minute; pods take 62s to start" in (
        decision.reason
    )
    off = scaling(**{**FIELDS, "projectArrivals": False})
    assert decide(seen(29.75, 3, 150.0, 29.5), off, [], 585.0, memory).replicas == 3


def test_a_ripple_smaller_than_a_replica_moves_nothing():
    # 48 +-3 req/s at 10 per replica: the peaks need 6 replicas, the troughs 5.
    ripple = [(float(t), 48 + 3 * math.sin(t / 90)) for t in range(0, 600, 15)]
    memory, current, counts = Memory(ripple, capacity=10.0), 5, [5]
    history: list[tuple[float, int]] = []
    for step in range(120):  # thirty minutes, about three periods
        now = 600.0 + 15 * step
        rate = 48 + 3 * math.sin(now / 90)
        p95 = 900 * rate / current / 10  # at the aim when a replica carries 10 req/s
        decision = decide(seen(rate, current, p95), SCALING, history, now, memory)
        memory, history, current = decision.memory, decision.history, decision.replicas
        counts.append(current)
    changes = [b for a, b in itertools.pairwise(counts) if a != b]
    assert changes == [6], counts  # up once for the first peak, then never down


def test_the_memory_survives_a_restart_through_status():
    memory = Memory(STEADY, [(6.25, 0.8), (7.5, 0.95)], 9.5, 700.0, 500.0, 560.0)
    stored = json.loads(json.dumps(memory.to_status()))
    assert Memory.from_status(stored) == memory
    assert Memory.from_status({}) == Memory()  # a status from before the autoscaler learned


def test_a_pods_start_up_is_its_creation_to_ready():
    def pod(ready: str | None, restarts: int = 0) -> dict:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready}]
        return {
            "metadata": {"creationTimestamp": "2026-12-03T10:00:00Z"},
            "status": {
                "startTime": "2026-12-03T10:00:40Z",  # after 40 s of scheduling and pulling
                "conditions": conditions if ready else [],
                "containerStatuses": [{"name": "engine", "restartCount": restarts}],
            },
        }

    assert children.startup_seconds(pod("2026-12-03T10:01:02Z")) == 62
    assert children.startup_seconds(pod(None)) is None  # not ready
    # Restarted two days later: its Ready turn dates the restart, not a start-up.
    assert children.startup_seconds(pod("2026-12-05T10:00:00Z", restarts=1)) is None
    assert children.startup_seconds({"status": {}}) is None


def test_a_capacity_from_the_spec_sizes_the_first_decision():
    # kvpilot bench --sweep said a replica holds its p95 target at 10 req/s: at the aim (0.9
    # of the target) it is counted 9 until the replicas' own latency says otherwise.
    seeded = scaling(**{**FIELDS, "replicaCapacityRequestsPerMinute": 600})
    # (p95 0.15 s: too light a load to learn from, so the seed stands)
    first = decide(seen(40.0, current=2, p95=150.0), seeded, [], 600.0, Memory(STEADY))
    assert first.replicas == 5 and "9.0 req/s per replica (from the spec): 2 -> 5" in first.reason
    unseeded = decide(seen(40.0, current=2, p95=150.0), SCALING, [], 600.0, Memory(STEADY))
    assert "p95 TTFT 0.15s" in unseeded.reason  # no capacity: the ratios decide


def test_over_target_the_ratios_still_count_whatever_the_capacity_says():
    # A seed far too high (20 req/s a replica, at p95 three times its target): sized from it,
    # 6 replicas would do, and at 3x no point is in range to learn a better figure. Steady
    # latency over target scales on the ratio all the same.
    seeded = scaling(**{**FIELDS, "replicaCapacityRequestsPerMinute": 1200})
    decision = decide(seen(100.0, current=6, p95=3000.0), seeded, [], 600.0, Memory(STEADY))
    assert decision.recommendation == 20 and decision.reason.startswith("p95 TTFT 3.00s")
    assert decision.replicas == 10  # scaleUp.maxStepReplicas (4) a decision


def test_waiting_requests_keep_a_replica():
    at_zero = scaling(**{**FIELDS, "minReplicas": 0})
    idle = Inputs(1, 0, 1, 0, 2.0, None, 0.0, arrivals=0.0, recent_arrivals=0.0)
    memory = Memory([(t, 0.0) for t, _ in STEADY], capacity=10.0)
    quiet = [(float(t), 0) for t in range(0, 600, 15)]
    assert decide(idle, at_zero, quiet, 600.0, memory).replicas == 1  # 2 waiting: not zero


def test_a_new_basis_forgets_the_capacity():
    memory = Memory(STEADY, [(10.0, 0.9)], capacity=10.0, learned_at=0.0, basis="before")
    given = Inputs(4, 0, 4, 0, 0.5, 3000.0, 2400.0, arrivals=40.0, basis="after")
    decision = decide(given, SCALING, [], 600.0, memory)
    assert decision.memory.basis == "after" and decision.memory.points == []
    assert decision.memory.capacity is None and "p95 TTFT 3.00s" in decision.reason


def test_every_sign_of_a_burst_extends_the_panic():
    memory = Memory(STEADY, capacity=10.0, panic_until=620.0)
    # 10 replicas already carry the burst: none to add, but the panic runs a window longer.
    decision = decide(seen(40.0, current=10, recent=95.0), SCALING, [], 610.0, memory)
    assert decision.replicas == 10 and decision.memory.panic_until == 670.0
