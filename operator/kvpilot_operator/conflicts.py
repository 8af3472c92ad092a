"""Writes of a ModelDeployment conditional on the version they were decided from.

kopf's peering lets one replica act, but it is no lease: nothing fences a replica that missed
its keep-alive (frozen, throttled, cut off from the API server) and acts on when it comes back,
and at each handover the leaving replica's writes already on their way still land. For that
while two replicas act at once. So every write the operator decides from what it read of a
ModelDeployment (the status refresh, the autoscaler's scale and status.autoscaling, the wake)
carries that resourceVersion: the API server answers 409 Conflict if anything was written since,
nothing is written, and the writer decides again from the newer object, as its watch delivers
it (no extra read), instead of overwriting what it has not seen.
"""

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError

CONFLICT = 409
POLL_SECONDS = 0.05


def version(md: Mapping[str, Any]) -> str | None:
    """The resourceVersion a decision was made from (None: a plain dict of a unit test)."""
    return (md.get("metadata") or {}).get("resourceVersion")


def conditional(patch: dict[str, Any], md: Mapping[str, Any]) -> dict[str, Any]:
    """`patch`, refused with 409 by the API server unless the object is still at md's version."""
    seen = version(md)
    return patch if seen is None else {**patch, "metadata": {"resourceVersion": seen}}


def is_conflict(exc: ApiError) -> bool:
    return exc.status.code == CONFLICT


async def newer(body: Mapping[str, Any], than: str | None, seconds: float) -> bool:
    """Until kopf's live `body` shows a version other than `than` (the watch event of the
    write that conflicted), for at most `seconds`; whether it did."""
    deadline = time.monotonic() + seconds
    while version(body) == than:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)
    return True
