"""Sweep: raise the offered rate step by step until the SLO breaks; the highest rate that held
is what one replica sustains, and the server's own metrics at that rate give the autoscaling
targets to set on a ModelDeployment (docs/bench.md explains the mapping).

A step passes when no request was rejected (429) and its goodput reaches the target share.
Rates grow geometrically from `start` (at most `max_steps` steps, never above `max_rate`), then
`refine` bisections between the last rate that passed and the first that failed narrow the
answer. Every step is a full run of the workload's classes under Poisson arrivals.
"""

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpilot_bench.stats import Slo

if TYPE_CHECKING:  # for the annotations only: a sweep's arithmetic needs none of the runner's
    from kvpilot_bench.runner import RunResult

# One step: the run at a rate and its report.
RunAt = Callable[[float], Awaitable[tuple["RunResult", dict]]]


@dataclass(frozen=True)
class SweepOptions:
    start: float = 0.5
    factor: float = 1.5
    max_rate: float = 1000.0
    max_steps: int = 8
    refine: int = 2
    step_duration_s: float = 30.0
    goodput_target: float = 0.95


def verdict(report: dict, target: float) -> tuple[bool, str]:
    """Did this step hold the SLO? And why, in words."""
    totals = report["totals"]
    rejected, share = totals["errors"]["rejected"], totals["goodput"]["share"]
    if report["interrupted"]:
        return False, "interrupted"
    if rejected:
        return False, f"{rejected} rejected (429)"
    if share is None:
        return False, "no request finished"
    if share < target:
        return False, f"goodput {share:.1%} < {target:.0%}"
    return True, f"goodput {share:.1%}"


def first_rates(options: SweepOptions) -> list[float]:
    rates: list[float] = []
    rate = options.start
    while len(rates) < options.max_steps and rate <= options.max_rate * (1 + 1e-9):
        rates.append(round(rate, 4))
        rate *= options.factor
    return rates


def between(passed: float | None, failed: float) -> float:
    """The next rate to try: the geometric middle (half the first rate below it)."""
    return round(failed / 2 if passed is None else math.sqrt(passed * failed), 4)


def recommend(report: dict, slo: Slo, rate: float | None = None) -> dict:
    """Autoscaling targets from the run at the highest sustainable rate `rate` (see
    docs/bench.md): the sweep runs against one replica, so that rate is one replica's
    capacity, the autoscaler's seed until it learns its own."""
    metric = "TimeToFirstToken" if slo.ttft_ms is not None else "EndToEnd"
    limit = slo.ttft_ms if slo.ttft_ms is not None else slo.e2e_ms
    server, notes = report["server"], []
    if server is not None:
        p95 = server["p95_ttft_ms"] if metric == "TimeToFirstToken" else server["p95_e2e_ms"]
        queue = server["queue_per_replica"]
    else:
        key = "ttft_ms" if metric == "TimeToFirstToken" else "e2e_ms"
        p95 = (report["totals"][key] or {}).get("p95")
        queue = None
        notes.append(
            "the server has no kvpilot /metrics: the latency target is the client's p95, "
            "which includes HTTP time the autoscaler does not see; no queue target"
        )
    latency_target = None
    if p95 is not None:
        latency_target = max(1, math.ceil(round(p95, 3)))  # 600.0000001 from buckets is 600
        if limit is not None and latency_target > limit:
            latency_target = math.floor(limit)
            notes.append(f"p95 {p95:.0f} ms at this rate is above the SLO: target set to the SLO")
    queue_target = None
    if queue is not None:
        queue_target = max(1, math.floor(queue))
        if queue < 1:
            notes.append(
                f"the queue averaged {queue:.2f} waiting requests per replica at this rate, below "
                "the smallest target (1): the latency target will act first"
            )
    return {
        "targetQueueDepth": queue_target,
        "targetLatencyP95Milliseconds": latency_target,
        "latencyMetric": metric,
        # The spec counts per minute: integers, as Kubernetes' API conventions want.
        "replicaCapacityRequestsPerMinute": None if rate is None else max(1, math.floor(rate * 60)),
        "notes": notes,
    }


def autoscaling_yaml(recommendation: dict) -> str:
    lines = ["autoscaling:", "  enabled: true"]
    keys = (
        "targetQueueDepth",
        "targetLatencyP95Milliseconds",
        "latencyMetric",
        "replicaCapacityRequestsPerMinute",
    )
    for key in keys:
        if recommendation.get(key) is not None:
            lines.append(f"  {key}: {recommendation[key]}")
    return "\n".join(lines)


@dataclass
class Step:
    rate: float
    result: "RunResult"
    report: dict
    passed: bool
    why: str


async def sweep(run_at: RunAt, options: SweepOptions, slo: Slo) -> tuple[list[Step], dict]:
    """Run steps through `run_at(rate) -> (RunResult, report)`; the steps and the report's
    sweep section. At most max_steps + refine runs."""
    steps: list[Step] = []
    best: Step | None = None
    failed: float | None = None

    async def step(rate: float) -> Step:
        result, report = await run_at(rate)
        passed, why = verdict(report, options.goodput_target)
        steps.append(Step(rate, result, report, passed, why))
        return steps[-1]

    for rate in first_rates(options):
        s = await step(rate)
        if not s.passed:
            failed = rate
            break
        best = s
    for _ in range(options.refine):
        # Nothing to refine until a step failed.
        if failed is None or steps[-1].report["interrupted"]:
            break
        s = await step(between(best.rate if best else None, failed))
        if s.passed:
            best = s
        else:
            failed = s.rate
    section = {
        "goodput_target": options.goodput_target,
        "steps": [{"rate": s.rate, "passed": s.passed, "why": s.why} for s in steps],
        "sustainable_rate": best.rate if best else None,
        "recommendation": recommend(best.report, slo, best.rate) if best else None,
    }
    return steps, section
