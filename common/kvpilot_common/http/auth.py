"""API keys: `Authorization: Bearer <key>` on every route but the probes, /metrics and the
API description (/openapi.json).

Keys come from --api-key-file (one per line, `#` comments) and KVPILOT_API_KEYS
(comma-separated). A source that is configured but yields no key stops the server at start:
serving without authentication because a Secret was empty would fail open. Keys are compared
in constant time and never logged.
"""

import hmac
import os
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from kvpilot_common.errors import ConfigError
from kvpilot_common.http.errors import error_response

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})
ENV_VAR = "KVPILOT_API_KEYS"


def load_api_keys(key_file: str | None) -> list[str]:
    """Every configured key; [] only when no source is configured (no authentication)."""
    keys: list[str] = []
    if (value := os.environ.get(ENV_VAR)) is not None:
        found = _keys(value.split(","))
        if not found:
            raise ConfigError(f"{ENV_VAR} is set but holds no API key")
        keys += found
    if key_file:
        try:
            found = _keys(Path(key_file).read_text().splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Cannot read the API key file {key_file}: {exc}") from exc
        if not found:
            raise ConfigError(
                f"The API key file {key_file} holds no API key (empty or only comments)"
            )
        keys += found
    return keys


def _keys(lines: list[str]) -> list[str]:
    return [k for k in (line.strip() for line in lines) if k and not k.startswith("#")]


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        # Two: a proxy before us may have checked the other one. Neither counts.
        header = values[0] if len(values) == 1 else b""
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
