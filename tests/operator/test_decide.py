"""decide(), table-driven: step up, noise inside the tolerance, scale-down stabilization, clamps,
loading pods, scrape failures, idle; requests held at the gateway (wake from zero, queue depth,
no sleep while wanted)."""

import itertools
import json
from dataclasses import replace

import pytest

from kvpilot_common import demand
from kvpilot_operator.decide import Inputs, decide, queue_depth, wake
from kvpilot_testing.autoscale_sim import scaling

SCALING = scaling(
    minReplicas=1,
    maxReplicas=8,
    targetQueueDepth=4,
    targetLatencyP95Milliseconds=1000,
    windowSeconds=60,
    intervalSeconds=15,
    scaleDown={"stabilizationSeconds": 300, "maxStepReplicas": 2},
    scaleUp={"stabilizationSeconds": 0, "maxStepReplicas": 4},
)


def inputs(current=2, queue=3.4, p95=850.0, starting=0, failures=0, scraped=None, finished=50):
    return Inputs(
        current=current,
        starting=starting,
        pods_scraped=current if scraped is None else scraped,
        scrape_failures=failures,
        queue_per_replica=queue,
        p95_ms=p95,
        finished=finished,
    )


# A long, steady history of lower recommendations: scale-down is allowed.
QUIET = [(t, 1) for t in range(0, 400, 15)]


@pytest.mark.parametrize(
    ("case", "given", "history", "replicas", "words"),
    [
        ("in the band below target", inputs(), [], 2, "within the target band: holding at 2"),
        ("noise inside the band", inputs(queue=3.5, p95=880), [], 2, "within the target band"),
        ("at target: act before it", inputs(p95=1000), [], 3, "2 -> 3"),
        ("p95 2.4x", inputs(p95=2400), [], 6, "p95 TTFT 2.40s vs target 1s over 60s: 2 -> 6"),
        ("queue 3x", inputs(queue=12), [], 6, "queue 12.0/replica vs target 4 over 60s: 2 -> 6"),
        ("step limit", inputs(queue=40), [], 6, "2 -> 6"),
        ("clamped at max", inputs(current=8, queue=20), [], 8, "(limited to 1..8)"),
        (
            "down needs a full window",
            inputs(current=4, queue=1, p95=200),
            [],
            4,
            "holding for 300s",
        ),
        ("down after the window", inputs(current=4, queue=1, p95=200), QUIET, 2, "4 -> 2"),
        (
            "highest recent recommendation wins",
            inputs(current=4, queue=1, p95=200),
            [*QUIET[:-2], (375, 3)],
            3,
            "4 -> 3",
        ),
        (
            "loading pods hold",
            inputs(current=4, queue=1, p95=200, starting=1),
            QUIET,
            4,
            "1 pods load",
        ),
        (
            "failed scrapes hold",
            inputs(current=4, queue=1, p95=200, failures=1),
            QUIET,
            4,
            "1 pods do not answer",
        ),
        (
            "no metrics at all",
            inputs(scraped=0, failures=2),
            [],
            2,
            "no metrics (2 scrapes failed)",
        ),
        ("idle", inputs(current=3, queue=0, p95=None, finished=0), QUIET, 1, "no traffic over 60s"),
    ],
)
def test_decide(case, given, history, replicas, words):
    decision = decide(given, SCALING, list(history), now=400.0)
    assert decision.replicas == replicas, decision.reason
    assert words in decision.reason


def test_limited_is_reported_and_history_is_kept_bounded():
    decision = decide(inputs(current=8, queue=20), SCALING, [(-1000.0, 3)], now=400.0)
    assert decision.limited and decision.replicas == 8
    assert decision.history == [(400.0, 45)]  # the stale entry is dropped, the new one kept


def test_a_burst_then_quiet_does_not_flap():
    history: list[tuple[float, int]] = []
    current, seen = 2, []
    for step in range(100):  # 15 s apart: 5 busy minutes, then 20 quiet ones
        now = step * 15.0
        busy = step < 20
        decision = decide(
            inputs(current=current, queue=12 if busy else 0.5, p95=3000 if busy else 300),
            SCALING,
            history,
            now,
        )
        history, current = decision.history, decision.replicas
        seen.append(current)
    changes = [b - a for a, b in itertools.pairwise(seen) if b != a]
    ups, downs = [c for c in changes if c > 0], [c for c in changes if c < 0]
    assert max(seen) == 8 and seen[-1] == 1
    # Up, then down: never down-then-up-again (no flapping).
    assert changes.index(downs[0]) > changes.index(ups[-1])


def test_a_restart_continues_from_the_history_kept_in_status():
    """The daemon keeps recommendations in status.autoscaling as JSON; a restarted operator
    reads them back and decides exactly as if it had never stopped (no early scale-down)."""
    busy, quiet = inputs(current=6, queue=12, p95=3000), inputs(current=6, queue=0.5, p95=300)
    history: list[tuple[float, int]] = []
    for step in range(10):
        history = decide(busy, SCALING, history, step * 15.0).history
    stored = json.loads(json.dumps([[t, r] for t, r in history]))  # the status round trip
    restored = [(float(t), int(r)) for t, r in stored]
    after_restart = decide(quiet, SCALING, restored, 150.0)
    uninterrupted = decide(quiet, SCALING, history, 150.0)
    assert after_restart == uninterrupted
    assert after_restart.replicas == 6  # the busy minutes still count: no scale-down yet


# -- requests held at the gateway (kvpilot_common.demand) ---------------------------------------

ZERO = scaling(
    minReplicas=0,
    maxReplicas=5,
    targetQueueDepth=2,
    windowSeconds=60,
    scaleUp={"stabilizationSeconds": 60, "maxStepReplicas": 3},
)


def asleep(held: int = 0, last: float | None = None) -> Inputs:
    """Zero replicas: no pods, no metrics; only the gateways' word."""
    return Inputs(0, 0, 0, 0, None, None, 0.0, held=held, last_demand=last)


@pytest.mark.parametrize(
    ("held", "settings", "replicas", "words"),
    [
        (1, ZERO, 1, "1 request held at the gateway: 0 -> 1"),
        (3, ZERO, 2, "3 requests held at the gateway: 0 -> 2"),  # ceil(3 / targetQueueDepth)
        (40, ZERO, 3, "40 requests held at the gateway: 0 -> 3"),  # the step limit
        (40, replace(ZERO, max_replicas=2), 2, "0 -> 2 (limited to 0..2)"),
        (5, scaling(targetLatencyP95Milliseconds=500, minReplicas=0), 1, "0 -> 1"),  # no queue
        (1, replace(ZERO, min_replicas=2), 2, "0 -> 2 (limited to 2..5)"),
    ],
)
def test_held_requests_wake_a_model_at_zero_at_once(held, settings, replicas, words):
    woken = wake(0, held, settings)
    assert woken is not None and woken.replicas == replicas and words in woken.reason
    # decide() applies the same rule, with no stabilization (it has no history at all here).
    decision = decide(asleep(held), settings, [], now=1000.0)
    assert (decision.replicas, decision.reason) == (woken.replicas, woken.reason)
    assert decision.history == [(1000.0, woken.recommendation)]


def test_no_wake_above_zero_without_requests_or_with_autoscaling_off():
    assert wake(1, 3, ZERO) is None  # already awake: the ordinary autoscaler's business
    assert wake(0, 0, ZERO) is None
    assert wake(0, 3, replace(ZERO, enabled=False)) is None  # turned off by its user
    decision = decide(asleep(), ZERO, [], now=1000.0)
    assert decision.replicas == 0 and "holding at 0" in decision.reason


def test_stale_gateway_entries_do_not_wake():
    now = 10_000.0
    annotations = {
        demand.annotation_key("gone"): demand.encode(4, now - demand.STALE_SECONDS - 1),
        demand.annotation_key("idle"): demand.encode(0, now),
    }
    held = demand.read(annotations, now)
    assert held == demand.Demand(0, now)
    assert decide(asleep(held.held, held.last), ZERO, [], now).replicas == 0
    annotations[demand.annotation_key("live")] = demand.encode(3, now - 5)
    assert decide(asleep(demand.read(annotations, now).held), ZERO, [], now).replicas == 2


def test_held_requests_count_as_queue_depth_above_zero():
    # Two pods with 1 waiting each: within the band alone; 6 more held at the gateway make
    # the queue 4 per pod, twice the target.
    given = Inputs(2, 0, 2, 0, 1.0, None, 50.0, held=6)
    decision = decide(given, ZERO, [], now=1000.0)
    assert queue_depth(given) == 4.0
    assert decision.replicas == 5 and "queue 4.0/replica" in decision.reason
    assert queue_depth(Inputs(2, 0, 2, 0, None, None, 50.0, held=6)) == 3.0


QUIET_ZERO = [(t, 0) for t in range(0, 1000, 15)]  # long enough for any scale-down


def test_not_idle_while_requests_are_held_or_were_held_within_the_window():
    idle = Inputs(1, 0, 1, 0, 0.0, None, 0.0)
    assert decide(idle, ZERO, QUIET_ZERO, now=1000.0).replicas == 0  # nothing wanted: sleep
    held = replace(idle, held=1)
    assert decide(held, ZERO, QUIET_ZERO, now=1000.0).replicas == 1
    recent = replace(idle, last_demand=1000.0 - 30)  # woken 30 s ago, no metrics of it yet
    decision = decide(recent, ZERO, QUIET_ZERO, now=1000.0)
    assert decision.replicas == 1 and "requests waited at the gateway" in decision.reason
    older = replace(idle, last_demand=1000.0 - 61)  # past the window: idle as ever
    assert decide(older, ZERO, QUIET_ZERO, now=1000.0).replicas == 0


def test_traffic_with_an_empty_queue_keeps_a_replica_while_wanted():
    # A queue-only target sees ratio 0 with no waiting requests; a model a request just
    # waited for at the gateway still keeps its replica.
    serving = Inputs(1, 0, 1, 0, 0.0, None, 20.0, last_demand=990.0)
    assert decide(serving, ZERO, QUIET_ZERO, now=1000.0).replicas == 1
