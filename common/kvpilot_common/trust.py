"""What a server believes of a request only because kvpilot's gateway sent it: a continuation
of a broken stream (kvpilot_continue) and the tenant a request is for. The gateway proves it
sent the request with a secret header, the same value on the gateway and its servers (from the
environment); a client, without the secret, can neither put words in the model's mouth under
another request's id nor claim another tenant's share."""

import hmac
import os

HEADER = "x-kvpilot-gateway-secret"
ENV = "KVPILOT_GATEWAY_SECRET"
TENANT_HEADER = "x-kvpilot-tenant"  # the tenant the gateway identified (http/keys.py)
WEIGHT_HEADER = "x-kvpilot-tenant-weight"
# The replica the gateway sent a request to, as stored_ids.replica_tag() names it: a server puts
# it in the ids of the responses it stores, so that the gateway sends their continuations back.
REPLICA_HEADER = "x-kvpilot-replica"
# A client's never pass the gateway.
HEADERS = frozenset({HEADER, TENANT_HEADER, WEIGHT_HEADER, REPLICA_HEADER})
# A server tells the gateway a forwarded request's tokens (prompt and completion), which the
# gateway charges to the tenant's tokens per minute: a header on a whole answer, a comment
# (`: kvpilot-usage-tokens N`) before a stream's [DONE].
USAGE_HEADER = "x-kvpilot-usage-tokens"
USAGE_COMMENT = "kvpilot-usage-tokens"


def secret_from_env() -> str | None:
    return os.environ.get(ENV) or None


def authorized(sent: str | bytes | None, secret: str | None) -> bool:
    """The header's value is the secret (compared in constant time); nothing is without one."""
    if not secret or sent is None:
        return False
    return hmac.compare_digest(sent.encode() if isinstance(sent, str) else sent, secret.encode())
