"""What the operator knows of its children without asking: kopf indexes of the Deployments and
Pods it manages (watched with a server-side label selector, so other workloads never reach the
operator), and a wake-up per ModelDeployment when one of them, or the ModelDeployment itself,
changes. The status daemon (handlers.keep_status) sleeps on that wake-up instead of polling."""

import asyncio
import copy
import datetime
from typing import Any

import kopf

from kvpilot_common.naming import INSTANCE_LABEL, MANAGED_BY
from kvpilot_operator.cluster import RESOURCE

MANAGED = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"  # the label selector the watches send
DEPLOYMENTS = ("apps", "v1", "deployments")
PODS = ("v1", "pods")
Key = tuple[str, str]  # (namespace, ModelDeployment name)
_wakers: dict[Key, asyncio.Event] = {}


def select(settings: kopf.OperatorSettings) -> None:
    """Watch only our children: the API server filters, not the operator."""
    settings.watching.label_selectors[DEPLOYMENTS] = MANAGED
    settings.watching.label_selectors[PODS] = MANAGED


def _key(namespace: str | None, labels: kopf.Labels) -> Key | None:
    instance = labels.get(INSTANCE_LABEL)
    return (namespace, instance) if namespace and instance else None


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A copy kopf's later events cannot change under a reader."""
    return copy.deepcopy(dict(body))


@kopf.index(*DEPLOYMENTS, labels={MANAGED_BY[0]: MANAGED_BY[1]})
def owned_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    key = _key(namespace, labels)
    return {key: _plain(body)} if key else None


@kopf.index(*PODS, labels={MANAGED_BY[0]: MANAGED_BY[1]})
def owned_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    key = _key(namespace, labels)
    return {key: _plain(body)} if key else None


def waker(namespace: str, name: str) -> asyncio.Event:
    return _wakers.setdefault((namespace, name), asyncio.Event())


def forget(namespace: str, name: str) -> None:
    _wakers.pop((namespace, name), None)


def _wake(namespace: str | None, name: str | None) -> None:
    event = _wakers.get((namespace or "", name or ""))
    if event is not None:
        event.set()


@kopf.on.event(*DEPLOYMENTS, labels={MANAGED_BY[0]: MANAGED_BY[1]})
@kopf.on.event(*PODS, labels={MANAGED_BY[0]: MANAGED_BY[1]})
def child_changed(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    """Runs after kopf updated the indexes with the same event."""
    _wake(namespace, labels.get(INSTANCE_LABEL))


@kopf.on.event(*RESOURCE)
def model_deployment_changed(namespace: str | None, name: str, **_: Any) -> None:
    """A new spec, or status.autoscaling (ScalingLimited derives from it)."""
    _wake(namespace, name)


def deployment(index: kopf.Index, namespace: str, name: str) -> dict | None:
    found = list(index.get((namespace, name), ()))
    return found[0] if found else None


def pods(index: kopf.Index, namespace: str, name: str) -> list[dict]:
    return list(index.get((namespace, name), ()))


async def sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Until woken, stopped or `seconds` passed (the safety resync)."""

    async def until_stopped() -> None:
        await stopped.wait()

    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(until_stopped())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


def startup_seconds(pod: dict) -> float | None:
    """Seconds from the pod's creation (scheduling and image pulls count: a replica asked for
    waits through them too) to its Ready condition turning True. None: not Ready, times
    missing, or a container restarted (its Ready turn then dates the restart, not the start).
    A pod whose readiness came and went later reports that later turn: the autoscaler takes
    the quickest of its pods for that reason."""
    status = pod.get("status", {})
    created = pod.get("metadata", {}).get("creationTimestamp")
    turned = [
        c.get("lastTransitionTime")
        for c in status.get("conditions") or []
        if c.get("type") == "Ready" and c.get("status") == "True"
    ]
    restarted = any(c.get("restartCount") for c in status.get("containerStatuses") or [])
    if not created or not turned or not turned[0] or restarted:
        return None
    seconds = _epoch(turned[0]) - _epoch(created)
    return seconds if seconds >= 0 else None


def _epoch(when: str) -> float:
    return datetime.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()


def ready(pod: dict) -> bool:
    """The pod's Ready condition is True: the autoscaler and the adapter report read only these."""
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
