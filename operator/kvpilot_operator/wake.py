"""Scale from zero the moment a gateway holds a request: a kopf handler on the raw watch of
ModelDeployments. A gateway's write of its held.gateway.kvpilot.dev annotation arrives here as a
watch event, so the model starts without waiting for the autoscaler's next interval.

A raw event handler, not on.update/on.field: those would write kopf's diffbase and progress
annotations back on every gateway write. The rule is decide.wake(), the one the periodic
autoscaler applies too (it catches whatever this misses: an event lost, a failed patch, an
operator restart). Once replicas are above zero this no longer fires, so a burst of gateway
writes scales once; an event older than the object's last write scales nothing (the patch is
conditional on its resourceVersion), so a wake is made and announced once. Autoscaling off
at zero replicas means the model was turned off: nothing wakes it.
"""

import asyncio
import time
from typing import Any

import kopf
from lightkube import ApiError

from kvpilot_common import demand
from kvpilot_operator import crd
from kvpilot_operator.autoscale_writes import scale
from kvpilot_operator.cluster import RESOURCE
from kvpilot_operator.decide import Decision, wake
from kvpilot_operator.spec import Spec


def woken(body: kopf.Body | dict, now: float) -> Decision | None:
    """What a ModelDeployment as it stands now asks for: replicas to start, or None."""
    meta = body.get("metadata", {})
    held = demand.read(meta.get("annotations"), now).held
    if held <= 0 or meta.get("deletionTimestamp"):
        return None  # every status write comes here too: decided without copying the object
    spec = Spec.from_defaulted(crd.defaulted(body))
    return wake(spec.replicas, held, spec.autoscaling)


def _asleep_and_wanted(body: kopf.Body, type: str | None = None, **_: Any) -> bool:
    return type != "DELETED" and woken(body, time.time()) is not None


@kopf.on.event(*RESOURCE, when=_asleep_and_wanted)
async def wake_on_demand(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    decision = woken(body, time.time())  # the filter's answer, unless the clock crossed STALE
    if decision is None:
        return
    md = crd.defaulted(body)
    try:
        # Conditional on this event's resourceVersion: an event queued before this handler's
        # own last wake landed still shows zero replicas, and would wake (and announce) twice.
        await asyncio.to_thread(
            scale, md, Spec.from_defaulted(md).replicas, decision, if_unchanged=True
        )
    except ApiError as exc:
        if exc.status.code != 409:
            raise
        # Written since this event: the event of that write decides (or the autoscaler does).
        logger.debug("wake skipped: %s changed since this event", md["metadata"]["name"])
