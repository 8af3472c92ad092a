"""How the gateway hands a broken stream to another replica (a request with kvpilot_continue):
the header that proves the request came from the gateway, and the secret both sides read from
the environment. A client cannot forge a continuation, which would let it put words in the
model's mouth under another request's id, without the secret."""

import hmac
import os

HEADER = "x-kvpilot-continue-secret"
ENV = "KVPILOT_CONTINUE_SECRET"  # the same value on the gateway and its servers


def secret_from_env() -> str | None:
    return os.environ.get(ENV) or None


def authorized(sent: str | None, secret: str | None) -> bool:
    """The header's value is the secret (compared in constant time); nothing is without one."""
    if not secret or sent is None:
        return False
    return hmac.compare_digest(sent.encode(), secret.encode())
