"""The autoscaler's writes (autoscaler.py decides): spec.replicas through the scale
subresource, with an Event and a count of it, and status.autoscaling, the record of the step.
Both conditional on the version of the object decided from (conflicts.py).

Also the wake's scale (wake.py), conditional the same way."""

from typing import Any

import kopf
from lightkube import ApiError
from lightkube.types import PatchType

from kvpilot_common.kube import ModelDeploymentResource
from kvpilot_operator import conflicts, metrics
from kvpilot_operator.cluster import cluster
from kvpilot_operator.decide import HELD, Decision, Inputs, queue_depth
from kvpilot_operator.status import timestamp

DECISIONS_KEPT = 10


def record(
    state: dict, inputs: Inputs, decision: Decision, now: float, pods: int, ready: int
) -> dict:
    """status.autoscaling after a step: what was observed, the recommendation history, the
    last decisions and whether the bounds clamped it. The autoscaler writes only this;
    status.status() turns `limited` into the ScalingLimited condition, so status.conditions
    keeps one writer. queueDepth is what decide() saw: the gateways' held requests included."""
    queue = queue_depth(inputs)
    observed = {
        "time": timestamp(now),
        "pods": pods,
        "readyPods": ready,
        "scrapeFailures": inputs.scrape_failures,
        "queueDepth": None if queue is None else round(queue, 2),
        "heldRequests": inputs.held,
        "p95Milliseconds": None if inputs.p95_ms is None else round(inputs.p95_ms),
        "arrivalsPerSecond": None if inputs.arrivals is None else round(inputs.arrivals, 3),
    }
    result: dict[str, Any] = {
        "observed": observed,
        "recommendation": decision.recommendation,
        "recommendations": [[round(t, 3), r] for t, r in decision.history],
        "reason": decision.reason,
        "limited": decision.limited,
        "decisions": list(state.get("decisions", [])),
        "startupSeconds": state.get("startupSeconds"),
        **decision.memory.to_status(),
    }
    if "lastScaleTime" in state:
        result["lastScaleTime"] = state["lastScaleTime"]
    if decision.replicas != inputs.current:
        entry = {"time": timestamp(now), "from": inputs.current, "to": decision.replicas}
        entry["inputs"] = {k: observed[k] for k in ("queueDepth", "p95Milliseconds")}
        entry["reason"] = decision.reason
        result["decisions"] = [*result["decisions"], entry][-DECISIONS_KEPT:]
        result["lastScaleTime"] = timestamp(now)
    return result


def cause(reason: str) -> str:
    """The scale events metric's reason label, from a decision's reason."""
    if HELD in reason:
        return "Demand"
    driver = reason.split(" ", 1)[0]
    causes = {"queue": "QueueDepth", "p95": "Latency", "no": "Idle", "arrivals": "Arrivals"}
    return causes.get(driver, "Burst" if driver == "burst:" else "Other")


def scale(md: dict, before: int, decision: Decision, *, if_unchanged: bool = False) -> str | None:
    """Set the replicas through the scale subresource (the only writer of spec.replicas while
    autoscaling is on), with an Event and a count of it; the object's resourceVersion after.

    if_unchanged: only if the object is still at md's resourceVersion (the API server answers
    409 Conflict otherwise, and nothing is written or announced), for a decision made from a
    version of the object that may be older than the last write."""
    meta = md["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    patch: dict[str, Any] = {"spec": {"replicas": decision.replicas}}
    if if_unchanged:
        patch = conflicts.conditional(patch, md)
    made = cluster().client.patch(
        ModelDeploymentResource.Scale, name, patch, namespace=namespace, patch_type=PatchType.MERGE
    )
    direction = "up" if decision.replicas > before else "down"
    metrics.scale_events.labels(namespace, name, direction, cause(decision.reason)).inc()
    kopf.event(md, type="Normal", reason=f"Scaled{direction.title()}", message=decision.reason)
    return made.metadata.resourceVersion if made.metadata else None


class Stale(Exception):
    """The object was written to since the version a step decided from."""

    def __init__(self, scaled: bool) -> None:
        super().__init__("written to since")
        self.scaled = scaled  # the scale was made before the status write met the conflict


def write(
    md: dict,
    inputs: Inputs,
    decision: Decision,
    state: dict,
    now: float,
    pods: int,
    ready: int,
    *,
    scaled: bool = False,
) -> None:
    """One try, conditional on md's version: the scale (unless `scaled`: an earlier try made
    it), then status.autoscaling conditional on the version the scale left. Raises Stale."""
    meta = md["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    at: dict = md  # the version the status write is conditional on
    try:
        if not scaled and decision.replicas != inputs.current:
            after = scale(md, inputs.current, decision, if_unchanged=True)
            scaled, at = True, {"metadata": {"resourceVersion": after}}
        autoscaling = record(state, inputs, decision, now, pods, ready)
        cluster().client.patch(
            ModelDeploymentResource.Status,
            name,
            conflicts.conditional({"status": {"autoscaling": autoscaling}}, at),
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as exc:
        if not conflicts.is_conflict(exc):
            raise
        raise Stale(scaled) from None
