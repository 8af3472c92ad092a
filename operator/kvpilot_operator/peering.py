"""More than one operator replica: kopf's own peering decides which one acts.

Each replica keeps itself alive in a peering object (kopf.dev: a KopfPeering in each watched
namespace, or a ClusterKopfPeering when watching all of them) and pauses while a live peer of a
higher priority is there: its watches close and its daemons stop, so it writes no status, no
children and no scale. kopf has no election beyond priorities (peers of equal priority all
pause), so each replica's priority is its start time, negated: the oldest replica acts, a new
one (a rollout's, a restart's) waits instead of taking over mid-way, and when the active one
goes the next oldest resumes: at once after a clean exit (kopf removes its record), within
`lifetime` seconds after a crash (its record expires).

kopf does not create the peering object, and Helm cannot create one in the release that
installs its CRD (it maps every object of a release before creating any), so each replica
creates it at start-up if it is missing.
"""

import random
import time
from collections.abc import Sequence
from typing import Any

import kopf
from lightkube import ApiError, Client, codecs
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from kvpilot_operator.cluster import FIELD_MANAGER

GROUP, VERSION = "kopf.dev", "v1"
# Registered with lightkube, so that codecs.from_dict() knows the kinds.
create_namespaced_resource(GROUP, VERSION, "KopfPeering", "kopfpeerings")
create_global_resource(GROUP, VERSION, "ClusterKopfPeering", "clusterkopfpeerings")
CRD_RETRY_SECONDS = 2  # the chart installs the CRDs beside the operator: wait for them
MEMO_KEY = "peering_namespaces"  # kopf's memo: where the peering objects go ([]: cluster-wide)


def priority(now_ns: int | None = None, salt: int | None = None) -> int:
    """Older is higher: minus the start time in microseconds, the last three digits random, so
    that two replicas starting in the same microsecond still differ (equal priorities would
    pause both)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    salt = random.randrange(1000) if salt is None else salt
    return -((now_ns // 1000) * 1000 + salt)


def settings(lifetime: int) -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    configured.peering.lifetime = lifetime
    return configured


def objects(name: str, namespaces: Sequence[str]) -> list[dict]:
    """The peering objects a replica watching `namespaces` ([]: all) uses."""
    api = f"{GROUP}/{VERSION}"
    if not namespaces:
        return [{"apiVersion": api, "kind": "ClusterKopfPeering", "metadata": {"name": name}}]
    return [
        {"apiVersion": api, "kind": "KopfPeering", "metadata": {"name": name, "namespace": ns}}
        for ns in namespaces
    ]


@kopf.on.startup()
def ensure_peering(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Create the peering objects that are missing (a no-op when standalone)."""
    if settings.peering.standalone or not settings.peering.mandatory:
        return
    client = Client(field_manager=FIELD_MANAGER)
    for obj in objects(settings.peering.name, memo.get(MEMO_KEY, [])):
        try:
            client.create(codecs.from_dict(obj))
        except ApiError as exc:
            if exc.status.code == 409:  # another replica made it, or an earlier start did
                continue
            if exc.status.code == 404:  # the kopf.dev CRD is not served (yet)
                raise kopf.TemporaryError(exc.status.message, delay=CRD_RETRY_SECONDS) from None
            raise
