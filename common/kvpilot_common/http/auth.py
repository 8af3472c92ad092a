"""Who is calling, and whether they may: `Authorization: Bearer <key>` (or `x-api-key: <key>`,
as Anthropic's clients send it) on every route but the probes, /metrics and the API description
(/openapi.json), the key's tenant, and its limits.

The keys and their tenants and limits are the key book's (http/keys.py), the limits' buckets
http/rate_limit.py's. Each request's caller is left in the ASGI scope's state for the routes
(`caller(request)`): the tenant the engine shares its capacity by, what charges the tenant's
tokens once the response's usage is known, and what the key may do with LoRA adapters at run
time (`adapters`). A request that kvpilot's gateway forwards with its secret
(kvpilot_common.trust) is for the tenant the gateway names, and is not limited again: the
gateway limited it, across all replicas at once. It has no say over adapters (the gateway
forwards no adapter route).
"""

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvpilot_common import trust
from kvpilot_common.http.errors import error_response
from kvpilot_common.http.keys import ADAPTERS_ALL, TENANT_NAME, Key, KeyBook, clamp_weight
from kvpilot_common.http.rate_limit import RateLimits, Verdict, refusal_headers

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})
STATE = "kvpilot_caller"


@dataclass(frozen=True)
class Caller:
    tenant: str = ""  # "": no API keys, everyone is one tenant
    weight: float = 1.0
    charge: Callable[[int], None] | None = None  # None: no tokens-per-minute limit to charge
    trusted: bool = False  # forwarded by kvpilot's gateway, with its secret
    adapters: str | None = None  # the key's `adapters=` (http/keys.py); None: no say over them


ANONYMOUS = Caller()  # a request no middleware saw: no rights beyond the routes' own
# No API keys: everyone is one tenant, and what the server's flags allow, everyone may (a
# server started with --allow-runtime-lora-updating and no keys lets anyone load adapters).
NO_KEYS = Caller(adapters=ADAPTERS_ALL)


def caller(request: Request) -> Caller:
    return request.scope.get("state", {}).get(STATE, ANONYMOUS)


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: KeyBook | None,
        limits: RateLimits | None = None,
        gateway_secret: str | None = None,  # a server behind kvpilot's gateway: whom to trust
        refused: Callable[[str, str], None] = lambda tenant, limit: None,  # a metric
        # A refusal (401, 429) in the shape of the API its path belongs to (path, response).
        shaped: Callable[[str, JSONResponse], JSONResponse] = lambda path, response: response,
    ) -> None:
        self.app, self.keys, self.limits, self.secret = app, keys, limits, gateway_secret
        self.refused, self.shaped = refused, shaped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        key = None
        if self.keys:
            key = self._authenticate(scope["headers"])
            if key is None:
                response = error_response(
                    401,
                    "Missing or invalid API key: send 'Authorization: Bearer <key>' "
                    "or 'x-api-key: <key>'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                response = self.shaped(scope["path"], response)
                await response(scope, receive, send)
                return
        # Only a server behind the gateway (it has the secret) looks for what the gateway says.
        forwarded = self._forwarded(dict(scope["headers"])) if self.secret else None
        verdict = None
        if forwarded is not None:
            who = forwarded
        elif key is not None:
            who = Caller(key.tenant, key.weight or 1.0, self._charger(key), adapters=key.adapters)
            if self.limits is not None and (key.rpm or key.tpm):
                verdict = self.limits.admit(key)
        else:
            who = NO_KEYS
        if verdict is not None and verdict.retry_after is not None:
            assert key is not None and verdict.limit is not None
            self.refused(key.tenant, verdict.limit)
            response = error_response(
                429,
                f"Rate limit reached for {key.tenant} on {verdict.limit} per minute: "
                f"retry in {verdict.retry_after:.3g} s",
                headers=refusal_headers(verdict),
            )
            response = self.shaped(scope["path"], response)
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[STATE] = who
        await self.app(scope, receive, _with_headers(send, verdict) if verdict else send)

    def _authenticate(self, raw: list[tuple[bytes, bytes]]) -> Key | None:
        """The key of `Authorization: Bearer <key>` or `x-api-key: <key>` (or both, if they
        agree). A header sent twice, or two that disagree, count for nothing: a proxy before
        us may have checked the other one."""
        assert self.keys is not None
        bearer = [v for k, v in raw if k == b"authorization"]
        api_key = [v for k, v in raw if k == b"x-api-key"]
        if len(bearer) > 1 or len(api_key) > 1:
            return None
        tokens = {v.strip() for v in api_key}
        for header in bearer:
            scheme, _, token = header.partition(b" ")
            if scheme.lower() != b"bearer":
                return None
            tokens.add(token.strip())
        if len(tokens) != 1:
            return None
        return self.keys.match(tokens.pop())

    def _forwarded(self, headers: dict[bytes, bytes]) -> Caller | None:
        """The tenant kvpilot's gateway names, with its secret. A gateway without keys names
        none: the request is then the key's, limits and all, as if sent here directly."""
        sent = headers.get(trust.HEADER.encode())
        if sent is None or not trust.authorized(sent, self.secret):
            return None
        tenant = headers.get(trust.TENANT_HEADER.encode(), b"").decode("latin-1")
        if not TENANT_NAME.match(tenant):
            return None
        try:
            weight = float(headers.get(trust.WEIGHT_HEADER.encode(), b"1"))
        except ValueError:
            weight = 1.0
        return Caller(tenant, clamp_weight(weight), trusted=True)

    def _charger(self, key: Key) -> Callable[[int], None] | None:
        limits = self.limits
        if limits is None or not key.tpm:
            return None
        return lambda tokens: limits.charge(key, tokens)


def _with_headers(send: Send, verdict: Verdict) -> Send:
    """The limit headers on the response, whatever route answers."""
    extra = [(k.encode(), v.encode()) for k, v in verdict.headers.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending
