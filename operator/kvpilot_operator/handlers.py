"""kopf handlers: thin. Spec in, render() and status() in the middle, writes at the edges.

There is no on.delete handler: children carry owner references and go with the garbage
collector. kopf still adds its own finalizer, because the status timer and the autoscale daemon
must be stopped when an object goes, so a deletion completes only while the operator runs.
"""

import os
import threading
from importlib.metadata import version
from typing import Any

import kopf

from kvpilot_operator import crd, metrics
from kvpilot_operator.cluster import Cluster
from kvpilot_operator.fit import Fit, check
from kvpilot_operator.naming import selector_labels
from kvpilot_operator.render import render
from kvpilot_operator.status import changed, is_warning, status, timestamp

RESOURCE = (crd.GROUP, crd.VERSION, crd.PLURAL)
STATUS_INTERVAL_SECONDS = float(os.environ.get("KVPILOT_STATUS_INTERVAL_SECONDS", "10"))
RETRY_SECONDS = 5  # after an API error; kopf's default of 60 s leaves status stale too long
_cluster: Cluster | None = None
_posted: dict[str, dict[str, tuple[str, str]]] = {}  # uid -> condition type -> last Event's
_posted_lock = threading.Lock()


def image() -> str:
    return os.environ.get("KVPILOT_IMAGE") or f"ghcr.io/kvpilot/kvpilot:{version('kvpilot')}"


def pull_secrets() -> tuple[str, ...]:
    """Secrets model pods pull their image with (the chart's imagePullSecrets), comma-separated."""
    names = os.environ.get("KVPILOT_IMAGE_PULL_SECRETS", "").split(",")
    return tuple(n.strip() for n in names if n.strip())


def cluster() -> Cluster:
    global _cluster
    _cluster = _cluster or Cluster()
    return _cluster


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: status belongs to our users.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvpilot.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvpilot.dev", key="last-handled-configuration"
    )


@kopf.on.resume(*RESOURCE, backoff=RETRY_SECONDS)
@kopf.on.create(*RESOURCE, backoff=RETRY_SECONDS)
@kopf.on.update(*RESOURCE, field="spec", backoff=RETRY_SECONDS)
def reconcile(body: kopf.Body, patch: kopf.Patch, name: str, namespace: str, **_: Any) -> None:
    with metrics.reconcile_seconds.labels(namespace, name).time():
        try:
            _reconcile(body, patch)
        except Exception:
            metrics.reconcile_errors.labels(namespace, name).inc()
            raise


def _reconcile(body: kopf.Body, patch: kopf.Patch) -> None:
    md = crd.defaulted(body)
    fit = check(md["spec"])
    # A spec that cannot fit creates no pods that would only OOM; what runs keeps running.
    if fit.fits is not False:
        objects = render(md, image(), pull_secrets())
        kopf.adopt(objects, owner=body)
        for obj in objects:
            cluster().apply(obj)
        if not any(o["kind"] == "PodDisruptionBudget" for o in objects):
            meta = md["metadata"]
            cluster().delete("PodDisruptionBudget", meta["name"], meta["namespace"])
    report(body, md, fit, patch)


@kopf.timer(
    *RESOURCE,
    interval=STATUS_INTERVAL_SECONDS,
    initial_delay=STATUS_INTERVAL_SECONDS,
    backoff=RETRY_SECONDS,
)
def refresh(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    md = crd.defaulted(body)
    report(body, md, check(md["spec"]), patch)


@kopf.on.delete(*RESOURCE, optional=True)
def forget(name: str, namespace: str, **_: Any) -> None:
    """A deleted ModelDeployment's gauges go with it (optional: the timer's finalizer already
    holds the deletion until this ran)."""
    metrics.forget(namespace, name)


def _first_to_post(uid: str, condition: dict) -> bool:
    """Reconcile and the status timer may both see the same change in the same old status;
    only the first of them posts its Event."""
    state = (condition["status"], condition["reason"])
    with _posted_lock:
        seen = _posted.setdefault(uid, {})
        if seen.get(condition["type"]) == state:
            return False
        seen[condition["type"]] = state
        return True


def report(body: kopf.Body, md: dict, fit: Fit, patch: kopf.Patch) -> None:
    """Status from the children and pods as they are now; an Event per condition change."""
    name, namespace = md["metadata"]["name"], md["metadata"]["namespace"]
    deployment = cluster().get("Deployment", name, namespace)
    pods = cluster().pods(namespace, selector_labels(name))
    new = status(md, deployment, pods, fit, timestamp())
    if not md["metadata"].get("deletionTimestamp"):  # forget() drops them on deletion
        metrics.set_replicas(
            namespace, name, new["desiredReplicas"], new["replicas"], new["readyReplicas"]
        )
    old_conditions = md.get("status", {}).get("conditions", [])
    for condition in changed(old_conditions, new["conditions"]):
        if not _first_to_post(md["metadata"]["uid"], condition):
            continue
        kopf.event(
            body,
            type="Warning" if is_warning(condition) else "Normal",
            reason=condition["reason"],
            message=f"{condition['type']}={condition['status']}: {condition['message']}",
        )
    current = md.get("status", {})
    for key, value in new.items():
        if current.get(key) != value:
            patch.status[key] = value
