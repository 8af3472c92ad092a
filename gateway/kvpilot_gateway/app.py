"""The gateway's routes: the OpenAI API in front of every watched model, the probes, /metrics.

A completion request is read (bounded, as the server reads it), its `model` resolved in the
catalog, and sent to one ready replica the balancer picks; if that replica fails before sending
its first byte the request goes to another (nothing reached the client yet, so a retry cannot
duplicate output). A model with no ready replica holds the request (holding.py) while the
operator scales it up. Errors are answered in OpenAI's shape, as the server answers them.
"""

import json
import logging
import time
from collections.abc import Callable

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvpilot_gateway.balance import Balancer, prefix_key
from kvpilot_gateway.catalog import Catalog, Model
from kvpilot_gateway.holding import Holds, StartingError
from kvpilot_gateway.load import Loads
from kvpilot_gateway.metrics import GatewayMetrics
from kvpilot_gateway.options import Settings
from kvpilot_gateway.proxy import UPSTREAM_ERRORS, Passthrough, open_upstream, unless_disconnected
from kvpilot_server.api.auth import ApiKeyMiddleware
from kvpilot_server.api.body import read_body
from kvpilot_server.api.errors import error_response, from_exception
from kvpilot_server.errors import InvalidRequestError, KvpilotError, OverloadedError

log = logging.getLogger("kvpilot.gateway")
CLIENT_CLOSED = 499  # nginx's code for a client that left; only metrics and logs see it
BODY_TIMEOUT = 30.0


class State:
    """Everything the routes share; main.py builds it and runs its background parts."""

    def __init__(self, settings: Settings, client: aiohttp.ClientSession | None, announce) -> None:
        self.settings, self.client = settings, client
        self.catalog = Catalog()
        self.loads = Loads()
        self.balancer = Balancer(settings.routing, settings.load_factor)
        self.metrics = GatewayMetrics()
        self.holds = Holds(settings, self.catalog, announce, self.metrics)
        self.synced = False
        self.draining = False
        self.in_flight = 0  # read by the drain

    def usable(self, model: Model) -> list[str]:
        return [e for e in self.catalog.endpoints(model.key) if not self.loads.is_down(e)]


def _parse(body: bytes) -> dict:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError("Request body must be a JSON object")
    if not isinstance(parsed.get("model"), str) or not parsed["model"]:
        raise InvalidRequestError("model: a model name is required", "model")
    return parsed


def build_app(state: State) -> Starlette:
    settings, catalog, metrics = state.settings, state.catalog, state.metrics

    async def complete(request: Request) -> Response:
        if state.draining:
            return error_response(503, "Draining: this gateway replica is shutting down")
        try:
            body = await read_body(request, BODY_TIMEOUT)
            parsed = _parse(body)
            model = catalog.resolve(parsed["model"])
        except KvpilotError as exc:
            metrics.unrouted.labels(type(exc).__name__).inc()
            return from_exception(exc)
        except ClientDisconnect:
            metrics.unrouted.labels("ClientDisconnect").inc()
            return Response(status_code=CLIENT_CLOSED)
        if parsed["model"] != model.served:  # namespace-qualified: the replica knows its name
            body = json.dumps({**parsed, "model": model.served}).encode()
        key = (
            prefix_key(parsed, settings.prefix_chars) if settings.routing == "prefix-load" else None
        )
        # Counted until the answer's last byte (Passthrough's end), for the drain.
        state.in_flight += 1
        response: Response | Passthrough | None = None
        try:
            response = await _route(request, model, body, key)
            return response  # type: ignore[return-value]
        finally:
            if not isinstance(response, Passthrough):
                state.in_flight -= 1

    async def _route(
        request: Request, model: Model, body: bytes, key: bytes | None
    ) -> Response | Passthrough:
        labels = model.key
        count = metrics.requests.labels
        tried: set[str] = set()
        for attempt in range(settings.retries + 1):
            endpoints = [e for e in state.usable(model) if e not in tried]
            if not endpoints and tried:
                break
            if not endpoints:
                if model.replicas == 0 and not model.autoscaling:
                    count(*labels, "unavailable").inc()
                    return error_response(
                        503,
                        f"The model {model.served!r} is scaled to zero and its autoscaling is "
                        "off: nothing will start it",
                    )
                try:
                    ready = state.holds.until_ready(model, lambda: state.usable(model))
                    endpoints = await unless_disconnected(ready, request.receive)
                except OverloadedError as exc:
                    count(*labels, "overloaded").inc()
                    return _with_retry_after(429, str(exc), exc.retry_after)
                except StartingError as exc:
                    count(*labels, "starting").inc()
                    return _with_retry_after(503, str(exc), exc.retry_after)
                except ClientDisconnect:
                    count(*labels, "client_closed").inc()
                    return Response(status_code=CLIENT_CLOSED)
            choice = state.balancer.pick(
                endpoints, {e: state.loads.load(e) for e in endpoints}, key
            )
            metrics.routing.labels(*labels, choice.reason).inc()
            endpoint = choice.endpoint
            if attempt:
                metrics.retries.labels(*labels).inc()
            state.loads.begin(endpoint)
            started = time.perf_counter()
            try:
                assert state.client is not None  # opened by the lifespan, before any request
                send = open_upstream(
                    state.client, endpoint, request.url.path, body, request.headers.raw
                )
                upstream = await unless_disconnected(send, request.receive)
            except ClientDisconnect:
                state.loads.end(endpoint)
                count(*labels, "client_closed").inc()
                return Response(status_code=CLIENT_CLOSED)
            except UPSTREAM_ERRORS as exc:  # nothing reached the client: another replica
                state.loads.end(endpoint)
                state.loads.mark_down(endpoint)
                tried.add(endpoint)
                log.warning("replica %s of %s/%s failed: %r", endpoint, *labels, exc)
                continue
            if upstream.status == 503 and attempt < settings.retries:
                # Draining or its engine stopped: the next replica can take it.
                upstream.close()
                state.loads.end(endpoint)
                tried.add(endpoint)
                continue
            metrics.upstream_seconds.labels(*labels).observe(time.perf_counter() - started)
            return Passthrough(upstream, _finish(endpoint, model, upstream.status))
        count(*labels, "upstream_error").inc()
        return _with_retry_after(
            503, f"No replica of the model {model.served!r} answered; retry the request", 1
        )

    def _finish(endpoint: str, model: Model, status: int) -> Callable[[str], None]:
        gauge = metrics.in_flight.labels(*model.key)
        gauge.inc()

        def done(outcome: str) -> None:
            state.in_flight -= 1
            gauge.dec()
            state.loads.end(endpoint)
            if outcome == "ok" and status >= 400:
                outcome = f"{status // 100}xx"
            metrics.requests.labels(*model.key, outcome).inc()

        return done

    async def models(_: Request) -> Response:
        cards = []
        for model in sorted(catalog.models.values(), key=lambda m: m.key):
            ready = len(state.usable(model))
            name = model.qualified if catalog.ambiguous(model) else model.served
            cards.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": model.namespace,
                    # Beyond OpenAI's card: can it answer now, or will it start first?
                    "ready": ready > 0,
                    "ready_replicas": ready,
                    "replicas": model.replicas,
                    "scale_from_zero": model.autoscaling,
                }
            )
        return JSONResponse({"object": "list", "data": cards})

    async def scrape(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(_: Request) -> Response:
        if state.draining:
            return error_response(503, "Draining: finishing in-flight requests before exit")
        if not state.synced:
            return error_response(503, "Listing ModelDeployments and their endpoints")
        return JSONResponse({"status": "ok"})

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "Internal server error")

    return Starlette(
        middleware=[Middleware(ApiKeyMiddleware, keys=list(settings.api_keys))],
        exception_handlers={Exception: unexpected},
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", scrape, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
        ],
    )


def _with_retry_after(status: int, message: str, seconds: int) -> Response:
    return error_response(status, message, headers={"Retry-After": str(seconds)})
