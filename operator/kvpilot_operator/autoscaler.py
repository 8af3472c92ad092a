"""The autoscale path's I/O: a kopf daemon per ModelDeployment with autoscaling on. Every
intervalSeconds: take its pods from the operator's watch, scrape the ready ones' /metrics,
observe() over the window, decide(), and write the result (autoscale_writes.py): replicas
through the scale subresource, status.autoscaling, an Event for every scale; the operator's
metrics (dropped again when the daemon stops).

What stabilization needs (recent recommendations, last decisions) and what decide() learns
(the arrivals' recent samples, a replica's capacity, a burst's panic, the pods' observed
start-up time) live in status.autoscaling, so an operator restart continues where it left off
instead of scaling on a fresh memory.

Requests held at the gateways come from the object's own annotations (kvpilot_common.demand):
read every step, they are also how a missed wake (wake.py) still happens within an interval.

A step decides from the object as it stands after the scrape, and writes conditionally on that
version (conflicts.py): written to since (another replica acting, a wake, a spec change, the
status refresh), the step decides again from the newer object, so no decision is made from, or
overwrites, one it has not seen.
"""

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kopf

from kvpilot_common import demand
from kvpilot_common.naming import PORT
from kvpilot_common.observe import Observation, Window, observe, parse
from kvpilot_operator import children, conflicts, crd, metrics
from kvpilot_operator.autoscale_writes import Stale, write
from kvpilot_operator.cluster import RESOURCE, RETRY_SECONDS, namespaced
from kvpilot_operator.decide import Decision, Inputs, decide, queue_depth
from kvpilot_operator.forecast import Memory
from kvpilot_operator.spec import Spec

SCRAPE_TIMEOUT_S = 2.0
WRITE_TRIES = 5  # decisions made again after a conflict, before the step gives up
logger = logging.getLogger(__name__)


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
                await step(body, window, client, children.pods(owned_pods, namespace, name))
                await stopped.wait(scaling.interval_seconds)
    finally:
        # Stopped: autoscaling turned off or the ModelDeployment deleted (handlers.forget drops
        # the rest then), or the operator exits: nothing updates the autoscaler's gauges any
        # more. After a failed step (kopf retries it) they stay: a gap would restart the `for`
        # of every alert on them.
        if stopped:
            metrics.forget(namespace, name, metrics.AUTOSCALER_GAUGES)


@dataclass(frozen=True)
class Scraped:
    """What one step's scrape found, which a decision made again after a conflict reuses."""

    observed: Observation | None
    failures: int
    pods: int  # not being deleted
    ready: list[dict]


async def step(
    body: Mapping[str, Any], window: Window, client: httpx.AsyncClient, pods: list[dict]
) -> Decision | None:
    """One decision for the ModelDeployment whose live view is `body` (kopf's: the watch keeps it
    current), written; None when every try met a newer write (the next step decides again)."""
    md = crd.defaulted(body)
    meta, scaling = md["metadata"], Spec.from_defaulted(md).autoscaling
    name, namespace = meta["name"], meta["namespace"]
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
    scraped = Scraped(observed, failures, len(pods), ready)
    written = await _settle(body, scraped, now)
    if written is None:
        logger.warning("%s/%s: written to during each of %d tries", namespace, name, WRITE_TRIES)
        return None
    inputs, decision = written
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


async def _settle(
    body: Mapping[str, Any], scraped: Scraped, now: float
) -> tuple[Inputs, Decision] | None:
    """Decide from the newest object and write, conditionally on its version; after a
    conflict, wait for the newer object and decide again. A scale already made stands: only its
    record is written again, onto the newer status.autoscaling."""
    scaled = False
    for _ in range(WRITE_TRIES):
        md = crd.defaulted(body)
        if not scaled:
            inputs, decision, state = _decide(md, scraped, now)
        else:
            state = {**_state(md), "startupSeconds": state.get("startupSeconds")}
        try:
            ready = len(scraped.ready)
            await asyncio.to_thread(
                write, md, inputs, decision, state, now, scraped.pods, ready, scaled=scaled
            )
            return inputs, decision
        except Stale as stale:
            scaled = stale.scaled
            await conflicts.newer(body, conflicts.version(md), SCRAPE_TIMEOUT_S)
    return None


def _state(md: dict) -> dict:
    return dict(md.get("status", {}).get("autoscaling") or {})


def _decide(md: dict, scraped: Scraped, now: float) -> tuple[Inputs, Decision, dict]:
    """The decision from the defaulted ModelDeployment `md` and the scrape, and the
    status.autoscaling it starts from."""
    spec, observed = Spec.from_defaulted(md), scraped.observed
    scaling = spec.autoscaling
    wanted = demand.read(md["metadata"].get("annotations"), now)
    state = _state(md)
    startup = _startup(scraped.ready, state, spec.probes.startup_timeout_seconds)
    inputs = Inputs(
        current=spec.replicas,
        starting=scraped.pods - len(scraped.ready),
        pods_scraped=observed.pods if observed else 0,
        scrape_failures=scraped.failures,
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
    return inputs, decision, {**state, "startupSeconds": startup}


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
