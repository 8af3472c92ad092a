"""status(ModelDeployment, what was observed) -> the status to write. Pure.

The conditions name the real cause, read from the pods themselves: the scheduler's message for
an unschedulable pod, the kubelet's for an image that cannot be pulled, OOMKilled, and the
server's own termination message when it could not start (kvpilot_common.termination), and
the API server's when it refused a child the reconcile applied (rejection.py).
"""

import datetime
import time
from dataclasses import dataclass
from typing import Any

from kvpilot_common import termination
from kvpilot_common.naming import endpoint, selector
from kvpilot_operator import rejection
from kvpilot_operator.fit import Fit
from kvpilot_operator.spec import Spec

_IMAGE_PULL = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
# The image is not on the node and its pull policy (Never) forbids fetching it: no pull failed.
_IMAGE_NEVER_PULLED = "ErrImageNeverPull"
_CONFIG = {"CreateContainerConfigError", "CreateContainerError"}


def timestamp(epoch: float | None = None) -> str:
    """Kubernetes' time format, for an epoch time (default now)."""
    moment = datetime.datetime.fromtimestamp(time.time() if epoch is None else epoch, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str


@dataclass(frozen=True)
class Cause:
    reason: str
    message: str
    blocking: bool = True  # False: work in progress (downloading, loading), not a fault


def _container_cause(status: dict, pod: str) -> Cause | None:
    name = status.get("name", "?")
    waiting = status.get("state", {}).get("waiting") or {}
    last = status.get("lastState", {}).get("terminated") or {}
    now = status.get("state", {}).get("terminated") or {}
    for terminated in (now, last):
        message = (terminated.get("message") or "").strip()
        if terminated.get("reason") == "OOMKilled":
            return Cause(
                "OOMKilled", f"container {name} of pod {pod} ran out of memory (OOMKilled)"
            )
        if (written := termination.parse(message)) is not None:
            return Cause(*written)
    reason = waiting.get("reason", "")
    detail = waiting.get("message") or reason
    if reason in _IMAGE_PULL:
        return Cause("ImagePullBackOff", f"pod {pod}: {detail}")
    if reason == _IMAGE_NEVER_PULLED:
        return Cause(reason, f"pod {pod}: {detail}")
    if reason in _CONFIG:
        return Cause(reason, f"pod {pod}: {detail}")
    if reason == "CrashLoopBackOff":
        code = last.get("exitCode")
        return Cause(
            "CrashLoopBackOff", f"container {name} of pod {pod} keeps exiting (code {code})"
        )
    return None


def pod_cause(pod: dict) -> Cause | None:
    """The most telling reason a pod is not serving, if it has one."""
    name, status = pod["metadata"]["name"], pod.get("status", {})
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message") or "no node fits the pod"
            return Cause("Unschedulable", f"pod {name} cannot be scheduled: {message}")
    for init in status.get("initContainerStatuses", []):
        terminated = init.get("state", {}).get("terminated") or {}
        if terminated.get("exitCode"):
            timed_out = terminated["exitCode"] == 124  # the timeout(1) wrapper
            what = "timed out" if timed_out else f"failed: {terminated.get('message', '').strip()}"
            return Cause("ModelDownloadFailed", f"downloading the model {what}")
        cause = _container_cause(init, name)
        if cause:
            return cause
        if "running" in init.get("state", {}):
            return Cause("DownloadingModel", f"pod {name} is downloading the model", False)
    for container in status.get("containerStatuses", []):
        cause = _container_cause(container, name)
        if cause:
            return cause
        if "running" in container.get("state", {}) and not container.get("ready"):
            return Cause("LoadingModel", f"pod {name} is loading the model", False)
    return None


def conditions(
    desired: int,
    ready: int,
    fit: Fit,
    pods: list[dict],
    rolled: bool,
    rejected: rejection.Rejection | None = None,
) -> list[Condition]:
    causes = [c for c in (pod_cause(p) for p in pods) if c]
    fault = next((c for c in causes if c.blocking), None)
    if rejected:  # the spec never reached the pods: what they say is about an older one
        fault = Cause(
            rejected.reason, f"the API server refused the {rejected.kind}: {rejected.message}"
        )
    if fit.fits is False:  # checked before any apply, and of the spec as it is now
        fault = Cause(fit.reason, fit.message)
    progress = next((c for c in causes if not c.blocking), None)
    counts = f"{ready}/{desired} replicas ready"
    if desired == 0:
        ready_condition = Condition("Ready", "False", "ScaledToZero", "no replicas requested")
    elif ready >= desired and rolled:
        ready_condition = Condition("Ready", "True", "AllReplicasReady", counts)
    else:
        why = fault or progress or Cause("ReplicasNotReady", "waiting for pods")
        ready_condition = Condition("Ready", "False", why.reason, f"{counts}: {why.message}")
    if fault:
        progressing = Condition("Progressing", "False", fault.reason, fault.message)
        degraded = Condition("Degraded", "True", fault.reason, fault.message)
    else:
        done = ready >= desired and rolled
        step = progress or Cause("RollingOut", "updating pods to the current spec")
        progressing = (
            Condition("Progressing", "False", "Complete", counts)
            if done
            else Condition("Progressing", "True", step.reason, step.message)
        )
        degraded = Condition("Degraded", "False", "AsExpected", "no problems found")
    return [ready_condition, progressing, degraded]


def scaling_limited(spec: Spec, autoscaling: dict) -> Condition | None:
    """ScalingLimited from the autoscaler's last step as it recorded it in status.autoscaling
    (the autoscaler writes nothing else, so status.conditions has one writer). None while
    autoscaling is off or before its first step."""
    if not spec.autoscaling.enabled or "limited" not in autoscaling:
        return None
    why = autoscaling.get("reason", "")
    if autoscaling["limited"]:
        return Condition("ScalingLimited", "True", "AtBounds", why)
    return Condition("ScalingLimited", "False", "WithinBounds", why)


def merge(old: list[dict], new: list[Condition], now: str, generation: int) -> list[dict]:
    """Conditions as stored: lastTransitionTime moves only when the status flips. Only `new`
    is kept: a condition status() no longer reports goes."""
    before = {c["type"]: c for c in old}
    merged = []
    for c in new:
        previous = before.get(c.type, {})
        since = previous.get("lastTransitionTime") if previous.get("status") == c.status else None
        merged.append(
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since or now,
                "observedGeneration": generation,
            }
        )
    return merged


def changed(old: list[dict], new: list[dict]) -> list[dict]:
    """Conditions whose status or reason differ from before: each deserves an Event, except
    ScalingLimited (each scale has its own Event, naming the bounds when they clamp it). And
    Degraded when the API server refused a new spec for a new cause: the reason stays
    InvalidPodSpec, but the refusal is news (the spec that changed is refused again)."""
    before = {c["type"]: (c["status"], c.get("reason")) for c in old}
    messages = {c["type"]: c.get("message") for c in old}

    def news(c: dict) -> bool:
        if before.get(c["type"]) != (c["status"], c.get("reason")):
            return c["type"] != "ScalingLimited"
        refused = c["type"] == "Degraded" and rejection.is_reason(c.get("reason", ""))
        return refused and messages.get(c["type"]) != c.get("message")

    return [c for c in new if news(c)]


def is_warning(condition: dict) -> bool:
    """Whether a condition's change is announced as a Warning Event (else Normal)."""
    kind, flag = condition["type"], condition["status"]
    if kind == "Degraded":
        return flag == "True"
    if kind == "Ready":
        return flag == "False" and condition.get("reason") != "ScaledToZero"
    if kind == "Progressing":  # False and Complete: a rollout finished
        return flag == "False" and condition.get("reason") != "Complete"
    return False


def status(
    body: dict, spec: Spec, deployment: dict | None, pods: list[dict], fit: Fit, now: str
) -> dict[str, Any]:
    """`body` (defaulted) gives the metadata and the status as stored, `spec` its spec."""
    meta = body["metadata"]
    generation = meta.get("generation", 1)
    desired = spec.desired_replicas
    observed = (deployment or {}).get("status", {})
    ready = observed.get("readyReplicas", 0) if deployment else 0
    rolled = bool(
        deployment
        and observed.get("updatedReplicas", 0) >= desired
        and observed.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
    )
    rejected = rejection.read(meta.get("annotations"))
    found = conditions(desired, ready, fit, pods, rolled, rejected)
    limited = scaling_limited(spec, body.get("status", {}).get("autoscaling") or {})
    found += [limited] if limited else []
    old = body.get("status", {}).get("conditions", [])
    result: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": observed.get("replicas", 0),
        "readyReplicas": ready,
        "desiredReplicas": desired,
        "readyText": f"{ready}/{desired}",
        "selector": selector(meta["name"]),
        "endpoint": endpoint(meta["name"], meta["namespace"], spec.service.port),
        "conditions": merge(old, found, now, generation),
    }
    if fit.capacity:
        result["capacity"] = fit.capacity
    return result
