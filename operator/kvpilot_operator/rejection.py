"""A child the API server refused for what it says (422 Invalid, 400 BadRequest, and server-side
apply's 500 for a field the schema lacks): how the reconcile records the refusal and how
status() reads it back. Pure.

The CRD leaves tolerations, affinity, nodeSelector keys and runtimeClassName to the Deployment's
own validation, so a spec can pass the CRD and still be refused when the operator applies its
Deployment. Retrying cannot help (the same spec gets the same answer), and the status daemon is
the one writer of status.conditions, so the reconcile hands the refusal over in an annotation of
the ModelDeployment (written through kopf's own patch of the object, with its progress
annotations): it survives an operator restart, so the condition does not flap while the resumed
reconcile tries again, and its arrival wakes the daemon like any change of the object.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANNOTATION = "kvpilot.dev/apply-rejected"
# What the API server answers for an object's content: the verdict of validation (422) or of
# decoding (400). Anything else (403, 409, 5xx, a lost connection) may pass on its own and is
# retried as before, but one 500: server-side apply answers a field the Deployment's schema
# does not have (a misspelt toleration or affinity key, which the CRD passes through) or a value
# of the wrong type with 500 "failed to create typed patch object" (kubernetes/kubernetes#122480,
# still so in v1.35; a fix to answer 400 is proposed in #139255). Cluster.apply sends the
# rendered dict as it is so that these reach the API server at all.
CODES = frozenset({400, 422})
TYPED_PATCH = "failed to create typed patch object"
REASONS = {
    "Deployment": "InvalidPodSpec",  # what the CRD leaves to it is all in the pod template
    "Service": "InvalidService",
    "PodDisruptionBudget": "InvalidPodDisruptionBudget",
}
# Enough for the API server's list of refused fields; kubectl describe stays readable.
MAX_MESSAGE = 1000


@dataclass(frozen=True)
class Rejection:
    kind: str  # of the child refused
    reason: str  # the Degraded reason
    message: str  # the API server's own words
    generation: int  # of the ModelDeployment whose spec was refused


def reason(kind: str) -> str:
    return REASONS.get(kind, f"Invalid{kind}")


def trim(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def message(status: Mapping[str, Any]) -> str:
    """The API server's Status as one line: its message (which lists every refused field for a
    422), else its causes, else its reason."""
    text = (status.get("message") or "").strip()
    if not text:
        causes = (status.get("details") or {}).get("causes") or []
        text = "; ".join(f"{c.get('field', '')}: {c.get('message', '')}" for c in causes)
    return trim(" ".join((text or status.get("reason") or "refused").split()))


def refused(code: int | None, message: str | None = None) -> bool:
    """Whether an API error is a verdict on the object's content."""
    return code in CODES or (code == 500 and (message or "").startswith(TYPED_PATCH))


def is_reason(reason: str) -> bool:
    """Whether a Degraded reason is a refusal's."""
    return reason in REASONS.values()


def record(kind: str, status: Mapping[str, Any], generation: int) -> str:
    """The annotation's value for a refusal of a child of `kind`."""
    found = {"kind": kind, "reason": reason(kind), "message": message(status)}
    return json.dumps({**found, "generation": generation}, sort_keys=True)


def read(annotations: Mapping[str, str] | None) -> Rejection | None:
    """The recorded refusal, or None. One the operator cannot read is ignored: a hand-edited
    annotation must not break status."""
    text = (annotations or {}).get(ANNOTATION)
    if not text:
        return None
    try:
        found = json.loads(text)
        return Rejection(
            str(found["kind"]),
            str(found["reason"]),
            trim(str(found["message"])),
            int(found["generation"]),
        )
    except (ValueError, TypeError, KeyError):
        return None
