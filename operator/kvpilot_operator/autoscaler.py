"""The autoscale path's I/O: a kopf daemon per ModelDeployment with autoscaling on. Every
intervalSeconds: take its pods from the operator's watch, scrape the ready ones' /metrics,
observe() over the window, decide(), and write the result: replicas through the scale
subresource, status.autoscaling, an Event for every scale, the operator's metrics (dropped
again when the daemon stops).

What stabilization needs (recent recommendations, last decisions) and what decide() learns
(the arrivals' recent samples, a replica's capacity, a burst's panic, the pods' observed
start-up time) live in status.autoscaling, so an operator restart continues where it left off
instead of scaling on a fresh memory.

Requests held at the gateways come from the object's own annotations (kvpilot_common.demand):
read every step, they are also how a missed wake (wake.py) still happens within an interval.
"""

import asyncio
import hashlib
import json
import time
from typing import Any

import httpx
import kopf
from lightkube.types import PatchType

from kvpilot_common import demand
from kvpilot_common.kube import ModelDeploymentResource
from kvpilot_common.naming import PORT
from kvpilot_common.observe import Window, observe, parse
from kvpilot_operator import children, crd, metrics
from kvpilot_operator.cluster import RESOURCE, RETRY_SECONDS, cluster, namespaced
from kvpilot_operator.decide import HELD, Decision, Inputs, decide, queue_depth
from kvpilot_operator.forecast import Memory
from kvpilot_operator.spec import Spec
from kvpilot_operator.status import timestamp

SCRAPE_TIMEOUT_S = 2.0
DECISIONS_KEPT = 10


async def _scrape(client: httpx.AsyncClient, pods: list[dict]) -> dict[str, str | None]:
    async def one(pod: dict) -> str | None:
        try:
            response = await client.get(f"http://{pod['status']['podIP']}:{PORT}/metrics")
            response.raise_for_status()
            return response.text
        except (httpx.HTTPError, KeyError):
            return None

    texts = await asyncio.gather(*(one(p) for p in pods))
    return {p["metadata"]["name"]: t for p, t in zip(pods, texts, strict=True)}


def _enabled(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("autoscaling") or {}).get("enabled"))


# As handlers.keep_status: kopf's DaemonFn cannot declare the index passed by name.
@kopf.daemon(  # type: ignore[arg-type]
    *RESOURCE, when=_enabled, cancellation_timeout=5.0, backoff=RETRY_SECONDS
)
async def autoscale(
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    owned_pods: kopf.Index,
    **_: Any,
) -> None:
    namespace = namespaced(namespace)
    window: Window | None = None
    try:
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            while not stopped:
                md = crd.defaulted(body)  # body is live: the newest spec
                scaling = Spec.from_defaulted(md).autoscaling
                if window is None or window.seconds != scaling.window_seconds:
                    window = Window(scaling.window_seconds)
                # The pods from the operator's watch (children.py): no API call per step.
                await step(md, window, client, children.pods(owned_pods, namespace, name))
                await stopped.wait(scaling.interval_seconds)
    finally:
        # Stopped: autoscaling turned off or the ModelDeployment deleted (handlers.forget drops
        # the rest then), or the operator exits: nothing updates the autoscaler's gauges any
        # more. After a failed step (kopf retries it) they stay: a gap would restart the `for`
        # of every alert on them.
        if stopped:
            metrics.forget(namespace, name, metrics.AUTOSCALER_GAUGES)


async def step(md: dict, window: Window, client: httpx.AsyncClient, pods: list[dict]) -> Decision:
    """One decision for the defaulted ModelDeployment `md`, written."""
    meta, spec = md["metadata"], Spec.from_defaulted(md)
    name, namespace, scaling = meta["name"], meta["namespace"], spec.autoscaling
    pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in pods if children.ready(p)]
    now = time.time()
    texts = await _scrape(client, ready)
    for pod, text in texts.items():
        if text is not None:
            window.add(pod, parse(text, now, scaling.latency_metric))
    window.keep_only(p for p, t in texts.items() if t is not None)
    failures = sum(1 for t in texts.values() if t is None)
    observed = observe(window, now, max(scaling.panic.window_seconds, scaling.interval_seconds))
    wanted = demand.read(meta.get("annotations"), now)
    state = md.get("status", {}).get("autoscaling", {})
    startup = _startup(ready, state, spec.probes.startup_timeout_seconds)
    inputs = Inputs(
        current=spec.replicas,
        starting=len(pods) - len(ready),
        pods_scraped=observed.pods if observed else 0,
        scrape_failures=failures,
        queue_per_replica=observed.queue_per_replica if observed else None,
        p95_ms=observed.p95_seconds * 1000 if observed and observed.p95_seconds else None,
        finished=observed.finished if observed else 0.0,
        held=wanted.held,
        last_demand=wanted.last,
        arrivals=observed.arrivals if observed else None,
        recent_arrivals=observed.recent_arrivals if observed else None,
        # Until a pod of this model has been seen to start, the startup probe's budget.
        startup_seconds=spec.probes.startup_timeout_seconds if startup is None else startup,
        basis=basis(md["spec"]),
    )
    history = [(float(t), int(r)) for t, r in state.get("recommendations", [])]
    decision = decide(inputs, scaling, history, now, Memory.from_status(state))
    state = {**state, "startupSeconds": startup}
    await asyncio.to_thread(_write, md, inputs, decision, state, now, len(pods), len(ready))
    labels = (namespace, name)
    metrics.scrape_failures.labels(*labels).inc(failures)
    metrics.max_replicas.labels(*labels).set(scaling.max_replicas)
    queue = queue_depth(inputs)
    if queue is not None:
        metrics.queue.labels(*labels).set(queue)
    if inputs.p95_ms is not None:
        metrics.p95.labels(*labels).set(inputs.p95_ms / 1000)
    if inputs.arrivals is not None:
        metrics.arrivals.labels(*labels).set(inputs.arrivals)
    if decision.memory.capacity is not None:
        metrics.capacity.labels(*labels).set(decision.memory.capacity)
    return decision


def basis(spec: dict) -> str:
    """A digest of what one replica's capacity depends on: the model, its engine and resources,
    and the targets it is measured against (the aim). A learned capacity holds for one."""
    scaling = spec.get("autoscaling") or {}
    keys = ("targetQueueDepth", "targetLatencyP95Milliseconds", "latencyMetric", "tolerancePercent")
    parts = {
        "model": spec.get("model"),
        "engine": spec.get("engine"),
        "resources": spec.get("resources"),
        "targets": {k: scaling.get(k) for k in keys},
        "seed": scaling.get("replicaCapacityRequestsPerMinute"),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _startup(ready: list[dict], state: dict, budget: int) -> float | None:
    """This model's pods' start-up time: the quickest ready pod's creation to Ready (a pod
    whose readiness came back later reports the later turn), else what status kept from
    before. At most the startup probe's budget: a pod still loading past it is restarted."""
    seen = [s for s in (children.startup_seconds(p) for p in ready) if s is not None]
    return round(min(min(seen), budget), 1) if seen else state.get("startupSeconds")


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


def scale(md: dict, before: int, decision: Decision, *, if_unchanged: bool = False) -> None:
    """Set the replicas through the scale subresource (the only writer of spec.replicas while
    autoscaling is on), with an Event and a count of it.

    if_unchanged: only if the object is still at md's resourceVersion (the API server answers
    409 Conflict otherwise, and nothing is written or announced), for a decision made from a
    watch event that may be older than the last write."""
    meta = md["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    patch: dict[str, Any] = {"spec": {"replicas": decision.replicas}}
    if if_unchanged:
        patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    cluster().client.patch(
        ModelDeploymentResource.Scale, name, patch, namespace=namespace, patch_type=PatchType.MERGE
    )
    direction = "up" if decision.replicas > before else "down"
    metrics.scale_events.labels(namespace, name, direction, cause(decision.reason)).inc()
    kopf.event(md, type="Normal", reason=f"Scaled{direction.title()}", message=decision.reason)


def _write(
    md: dict, inputs: Inputs, decision: Decision, state: dict, now: float, pods: int, ready: int
) -> None:
    meta = md["metadata"]
    name, namespace, before = meta["name"], meta["namespace"], inputs.current
    if decision.replicas != before:
        scale(md, before, decision)
    cluster().client.patch(
        ModelDeploymentResource.Status,
        name,
        {"status": {"autoscaling": record(state, inputs, decision, now, pods, ready)}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
