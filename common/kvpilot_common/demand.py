"""Held requests: how a gateway tells the operator that a model with no ready replica is wanted.

Each gateway replica owns one annotation on the ModelDeployment (server-side apply, its own
field manager, so gateways never overwrite each other):

    held.gateway.kvpilot.dev/<gateway id>: {"held": 3, "time": "2026-12-01T02:00:00Z"}

It writes it when its count of held requests for that model changes (and refreshes it while
requests stay held), so the operator hears of demand from the watch it already has, at once,
with no scrape interval, and the demand outlives the gateway: a gateway that dies while holding
requests leaves the annotation, and the operator scales up all the same. An entry not refreshed
within STALE_SECONDS no longer counts as held (its gateway is gone), but its time still says when
a request last waited.

Pure and standard library only: the gateway writes with it, the operator reads with it.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

PREFIX = "held.gateway.kvpilot.dev/"
# A gateway rewrites its entry at least this often while it holds requests for the model...
REFRESH_SECONDS = 10.0
# ...so an entry older than this was left by a gateway that is gone: its requests are not held.
STALE_SECONDS = 3 * REFRESH_SECONDS
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def annotation_key(gateway_id: str) -> str:
    """The annotation a gateway owns. An annotation's name part is at most 63 characters of
    [-A-Za-z0-9_.]; a longer or odd id (a pod name can reach 253) is shortened by a hash."""
    if _NAME.match(gateway_id):
        return PREFIX + gateway_id
    digest = hashlib.sha256(gateway_id.encode()).hexdigest()[:12]
    safe = re.sub(r"[^-A-Za-z0-9_.]", "-", gateway_id)[:50].strip("-_.") or "gateway"
    return f"{PREFIX}{safe}-{digest}"


def _timestamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode(held: int, when: float) -> str:
    return json.dumps({"held": held, "time": _timestamp(when)}, separators=(",", ":"))


@dataclass(frozen=True)
class Demand:
    held: int  # requests held now by live gateways
    last: float | None  # when a gateway last reported (held or not); None: never


def read(annotations: Mapping[str, str] | None, now: float) -> Demand:
    """The demand the gateways report on one ModelDeployment. Entries that do not parse are
    ignored (anyone who may edit the object may write an annotation)."""
    held, last = 0, None
    for key, value in (annotations or {}).items():
        if not key.startswith(PREFIX):
            continue
        try:
            entry = json.loads(value)
            count = int(entry["held"])
            when = datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except (ValueError, TypeError, KeyError):
            continue
        stamp = when.timestamp()
        last = stamp if last is None else max(last, stamp)
        if count > 0 and now - stamp <= STALE_SECONDS:
            held += count
    return Demand(held, last)
