"""kopf handlers: thin. Spec in, render() and status() in the middle, writes at the edges.

Two writers, each of its own part: reconcile() writes the children, and keep_status(), a daemon
per ModelDeployment, writes its status (all of it but status.autoscaling, the autoscaler's). A
child the API server refuses reaches status through the kvpilot.dev/apply-rejected annotation
that reconcile() leaves on the ModelDeployment (rejection.py), not through a write of its own. The
daemon recomputes status when a child or the object changes (children.py: kopf indexes fed by
watches, so it costs no API calls) and writes only what changed; a slow resync is the safety net.
Its write is conditional on the version it read (conflicts.py): refused, nothing is written or
announced, and the watch event of the newer write wakes it to recompute, so two replicas acting
at once (peering has no fencing) write and announce each change once.

There is no on.delete handler for children: they carry owner references and go with the
garbage collector. kopf adds its own finalizer, because the daemons must be stopped when an
object goes, so a deletion completes only while the operator runs.
"""

import asyncio
import os
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

import kopf
from lightkube import ApiError

from kvpilot_operator import (
    children,
    conflicts,
    crd,
    credentials,
    metrics,
    rejection,
    replica_adapters,
)
from kvpilot_operator.cluster import RESOURCE, RETRY_SECONDS, cluster, namespaced
from kvpilot_operator.fit import check
from kvpilot_operator.render import Plan, render
from kvpilot_operator.spec import Spec
from kvpilot_operator.status import changed, is_warning, status, timestamp

# Nothing is polled: this only bounds how long a missed event could leave status stale.
RESYNC_SECONDS = float(os.environ.get("KVPILOT_STATUS_RESYNC_SECONDS", "300"))
# A pod's updates come in bursts (scheduled, started, ready): one recomputation for a burst.
SETTLE_SECONDS = 0.05


def image() -> str:
    return os.environ.get("KVPILOT_IMAGE") or f"ghcr.io/kvpilot/kvpilot:{version('kvpilot')}"


def pull_secrets() -> tuple[str, ...]:
    """Secrets model pods pull their image with (the chart's imagePullSecrets), comma-separated."""
    names = os.environ.get("KVPILOT_IMAGE_PULL_SECRETS", "").split(",")
    return tuple(n.strip() for n in names if n.strip())


def gateway_secret() -> tuple[str, str] | None:
    """The Secret and key holding the gateway's secret (the chart's gateway.secretRef),
    `name/key`; each model namespace must hold it, as the pull secrets."""
    name, _, key = os.environ.get("KVPILOT_GATEWAY_SECRET_REF", "").partition("/")
    return (name, key) if name and key else None


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return credentials.connection(os.environ, **kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: status belongs to our users.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvpilot.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvpilot.dev", key="last-handled-configuration"
    )
    children.select(settings)


@kopf.on.resume(*RESOURCE, backoff=RETRY_SECONDS)
@kopf.on.create(*RESOURCE, backoff=RETRY_SECONDS)
@kopf.on.update(*RESOURCE, field="spec", backoff=RETRY_SECONDS)
def reconcile(
    body: kopf.Body, patch: kopf.Patch, name: str, namespace: str | None, **_: Any
) -> None:
    with metrics.reconcile_seconds.labels(namespace, name).time():
        try:
            _reconcile(body, patch)
        except Exception:
            metrics.reconcile_errors.labels(namespace, name).inc()
            raise


def _reconcile(body: kopf.Body, patch: kopf.Patch) -> None:
    md = crd.defaulted(body)
    meta, spec = md["metadata"], Spec.from_defaulted(md)
    # A spec that cannot fit creates no pods that would only OOM; what runs keeps running.
    # keep_status() says why, from the same check.
    if check(spec).fits is False:
        _forget_rejection(meta, patch)  # nothing was applied, so nothing was refused
        return
    plan = render(meta["name"], meta["namespace"], spec, image(), pull_secrets(), gateway_secret())
    _carry_out(plan, body, patch, meta.get("generation", 1))
    _forget_rejection(meta, patch)


def _carry_out(plan: Plan, body: kopf.Body, patch: kopf.Patch, generation: int) -> None:
    """Apply the plan's objects, then delete the children it no longer has."""
    objects = list(plan.apply)
    kopf.adopt(objects, owner=body)
    # In render()'s order, Deployment first: a refused Deployment leaves no new Service or PDB
    # behind (and an existing model keeps its children as they were). A Service or PDB refused
    # after it would leave the new Deployment applied; the CRD's enums and bounds leave nothing
    # in them for the API server to refuse.
    for obj in objects:
        try:
            cluster().apply(obj)
        except ApiError as exc:
            if not rejection.refused(exc.status.code, exc.status.message):
                raise  # may pass by itself: kopf retries every RETRY_SECONDS
            answer = exc.status.to_dict()
            refusal = rejection.record(obj["kind"], answer, generation)
            patch.metadata.annotations[rejection.ANNOTATION] = refusal
            # Permanent, not kopf's retry: this spec gets this answer every time, so retrying
            # would only log it every 5 s. kopf marks the change handled, the next spec change
            # (a new generation) runs reconcile at once, and a restarted operator (perhaps on an
            # upgraded API server) tries once more on resume.
            why = rejection.message(answer)
            raise kopf.PermanentError(f"the API server refused the {obj['kind']}: {why}") from None
    for gone in plan.delete:
        cluster().delete(gone.kind, gone.name, gone.namespace)


def _forget_rejection(meta: dict, patch: kopf.Patch) -> None:
    if rejection.ANNOTATION in (meta.get("annotations") or {}):
        patch.metadata.annotations[rejection.ANNOTATION] = None  # merge patch: remove it


# kopf passes its indexes (owned_pods, ...) as keyword arguments named after them, which its
# DaemonFn protocol cannot declare (kopf's own TODO: ParamSpec), so mypy sees a required keyword
# the protocol lacks.
@kopf.daemon(*RESOURCE, cancellation_timeout=5.0, backoff=RETRY_SECONDS)  # type: ignore[arg-type]
async def keep_status(
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    owned_deployments: kopf.Index,
    owned_pods: kopf.Index,
    **_: Any,
) -> None:
    namespace = namespaced(namespace)
    wake = children.waker(namespace, name)
    try:
        while not stopped:
            wake.clear()  # before the copy: a write after it wakes the next round
            md = crd.defaulted(body)  # copied here, not in the thread kopf's events race
            deployment = children.deployment(owned_deployments, namespace, name)
            pods = children.pods(owned_pods, namespace, name)
            spec = Spec.from_defaulted(md)
            adapters = await replica_adapters.loaded(pods) if spec.adapters else None
            await asyncio.to_thread(report, md, deployment, pods, adapters)
            settled = adapters is None or replica_adapters.converged(spec, adapters)
            timeout = RESYNC_SECONDS if settled else replica_adapters.CONVERGING_SECONDS
            await children.sleep(wake, stopped, timeout)
            await asyncio.sleep(SETTLE_SECONDS)
    finally:
        if stopped:
            children.forget(namespace, name)
            # Also when kopf's peering pauses this replica: its numbers would go stale while
            # another replica reports the same ModelDeployment (the autoscaler drops its own).
            metrics.forget(namespace, name, metrics.STATUS_GAUGES)


@kopf.on.delete(*RESOURCE, optional=True)
def forget(name: str, namespace: str | None, **_: Any) -> None:
    """A deleted ModelDeployment's gauges go with it (optional: the daemons' finalizer already
    holds the deletion until this ran)."""
    metrics.forget(namespaced(namespace), name)


def report(
    body: Mapping[str, Any],
    deployment: dict | None,
    pods: list[dict],
    adapters: list[dict] | None = None,
) -> bool:
    """Status from the children as they are now (and `adapters`, what the ready replicas say
    they have loaded: replica_adapters.py) onto the object as read in `body`: write what changed,
    if nothing was written since, then an Event per condition change. Whether it wrote."""
    md: dict = crd.defaulted(body)  # kopf.event() takes a plain dict as the autoscaler passes
    name, namespace = md["metadata"]["name"], md["metadata"]["namespace"]
    spec = Spec.from_defaulted(md)
    new = status(md, spec, deployment, pods, check(spec), timestamp())
    new["loadedAdapters"] = adapters  # None (no spec.adapters) removes a stale list
    if not md["metadata"].get("deletionTimestamp"):  # forget() drops them on deletion
        metrics.set_replicas(
            namespace, name, new["desiredReplicas"], new["replicas"], new["readyReplicas"]
        )
    current = md.get("status", {})
    update = {key: value for key, value in new.items() if current.get(key) != value}
    if not update:
        return False
    try:
        cluster().patch_status(name, namespace, update, conflicts.version(md))
    except ApiError as exc:
        if not conflicts.is_conflict(exc):
            raise
        return False  # written since: its watch event wakes the daemon to recompute
    # Announced by the writer of the change alone, after the write: once, however many act.
    for condition in changed(current.get("conditions", []), new["conditions"]):
        kopf.event(
            md,
            type="Warning" if is_warning(condition) else "Normal",
            reason=condition["reason"],
            message=f"{condition['type']}={condition['status']}: {condition['message']}",
        )
    return True
