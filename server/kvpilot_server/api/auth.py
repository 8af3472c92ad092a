"""API keys: `Authorization: Bearer <key>` on every route but the probes, /metrics and the
API description (/openapi.json).

Keys come from --api-key-file (one per line) and KVPILOT_API_KEYS (comma-separated). They are
compared in constant time and never logged.
"""

import hmac
import os
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from kvpilot_server.api.errors import error_response

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})


def load_api_keys(key_file: str | None) -> list[str]:
    keys = [k.strip() for k in os.environ.get("KVPILOT_API_KEYS", "").split(",")]
    if key_file:
        keys += [line.strip() for line in Path(key_file).read_text().splitlines()]
    return [k for k in keys if k and not k.startswith("#")]


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        # Compare against every key so the time taken says nothing about which one is close.
        valid = scheme.lower() == b"bearer" and any(
            [hmac.compare_digest(token.strip(), key) for key in self.keys]
        )
        if valid:
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "Missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)
