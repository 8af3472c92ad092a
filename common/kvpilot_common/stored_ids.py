"""The ids of stored responses (the Responses API's `store`), which say where they are kept.

A stored response lives in the memory of the replica that made it. Behind kvpilot's gateway a
conversation's next turn (`previous_response_id`), and a GET or DELETE of it, must reach that
replica, whichever the balancer would pick. So the gateway names each replica it forwards to
with a tag (a hash of its address: the same on every gateway replica, and after a gateway
restart, with nothing shared or stored), the server puts the tag in the ids it makes, and the
gateway reads it back from the id. A replica replaced (a new pod, a new address) has a new tag:
an id of the old one then names no replica, and the gateway says the conversation is gone.
"""

import hashlib
import re
import uuid

PREFIX = "resp_"
_TAG = re.compile(r"[0-9a-f]{12}")
_TAGGED = re.compile(rf"{PREFIX}({_TAG.pattern})_[0-9a-f]{{32}}")


def replica_tag(endpoint: str) -> str:
    """The tag of the replica at `endpoint` ("host:port")."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:12]


def valid_tag(tag: str | None) -> bool:
    return tag is not None and _TAG.fullmatch(tag) is not None


def new_id(tag: str | None) -> str:
    """A fresh response id; with a tag, the replica's (untagged: made with no gateway)."""
    if tag is not None and valid_tag(tag):
        return f"{PREFIX}{tag}_{uuid.uuid4().hex}"
    return f"{PREFIX}{uuid.uuid4().hex}"


def tag_of(response_id: object) -> str | None:
    """The replica tag in an id new_id() made with one; None for any other value."""
    if not isinstance(response_id, str):
        return None
    match = _TAGGED.fullmatch(response_id)
    return match.group(1) if match else None
