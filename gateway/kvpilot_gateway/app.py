"""The gateway's routes: the OpenAI API in front of every watched model, the probes, /metrics.

A completion request is read (bounded, as the server reads it, and its bytes counted against
the gateway's body budget), reduced to what routing needs (target.py), its `model` resolved in
the catalog, and sent to one ready replica the balancer picks; if that replica fails before
sending its first byte the request goes to another (nothing reached the client yet, so a retry
cannot duplicate output). A model with no ready replica holds the request (holding.py) while
the operator scales it up. Errors are answered in OpenAI's shape, as the server answers them.
"""

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from kvpilot_common.errors import KvpilotError, ModelNotFoundError, OverloadedError
from kvpilot_common.http.auth import ApiKeyMiddleware, caller
from kvpilot_common.http.body import read_body
from kvpilot_common.http.errors import error_response, from_exception
from kvpilot_gateway import adapters, budget, headers, resume, stored, target, usage
from kvpilot_gateway.budget import Lease
from kvpilot_gateway.catalog import Model
from kvpilot_gateway.failover import Failover
from kvpilot_gateway.holding import StartingError
from kvpilot_gateway.proxy import (
    CLIENT_CLOSED,
    UPSTREAM_ERRORS,
    Passthrough,
    UpstreamTimeout,
    open_upstream,
    unless_disconnected,
)
from kvpilot_gateway.state import State
from kvpilot_gateway.status_routes import status_routes

log = logging.getLogger("kvpilot.gateway")


def build_app(state: State) -> Starlette:
    settings, catalog, metrics = state.settings, state.catalog, state.metrics

    async def complete(request: Request) -> Response:
        if state.draining:
            return _with_retry_after(503, "Draining: this gateway replica is shutting down", 1)
        upstream_headers = headers.of_request(request, settings)
        refused = headers.too_large(upstream_headers)
        if refused is not None:  # known before the body: it is not read
            metrics.unrouted.labels("HeadersTooLarge").inc()
            return error_response(431, refused, headers={"Connection": "close"})
        # Counted until the answer's last byte (Passthrough's end), for the drain.
        state.in_flight += 1
        response: Response | Passthrough | None = None
        try:
            holder = budget.holder(caller(request).tenant, request.scope.get("client"))
            with state.bodies.lease(holder) as lease:
                try:
                    wanted = await _read(request, lease)
                    model = catalog.resolve(wanted.model)
                except KvpilotError as exc:
                    metrics.unrouted.labels(type(exc).__name__).inc()
                    return _refused(exc)
                except ClientDisconnect:
                    metrics.unrouted.labels("ClientDisconnect").inc()
                    return Response(status_code=CLIENT_CLOSED)
                resumable = bool(
                    wanted.resumable
                    and request.url.path in RESUMABLE_PATHS
                    and settings.gateway_secret
                    and settings.max_resumes
                )
                # Only the replica's copy of the body is kept from here on.
                wanted = target.for_replica(wanted, model.served, resumable)
                response = await _route(request, model, wanted, upstream_headers)
                return response  # type: ignore[return-value]
        finally:
            if not isinstance(response, Passthrough):
                state.in_flight -= 1

    async def _read(request: Request, lease: Lease) -> target.Target:
        body = await read_body(
            request, settings.body_timeout, target.MAX_CLIENT_BODY_BYTES, reserve=lease.add
        )
        chars = settings.prefix_chars if settings.routing == "prefix-load" else None
        with lease.borrowed(target.parse_cost(body)):
            return target.parse(body, chars)

    async def _route(
        request: Request, model: Model, wanted: target.Target, sent: list[tuple[bytes, bytes]]
    ) -> Response | Passthrough:
        """The request's way to a replica, its tenant's tokens reserved for it (usage.py): the
        response settles them, or they come back if no replica answers it."""
        who, reservation = caller(request), None
        # Without the secret no server reports tokens (options.py refuses tpm limits then).
        if who.charge is not None and settings.gateway_secret:
            scraped = (state.loads.scraped(e) for e in state.usable(model))
            context = max((load.context for load in scraped if load is not None), default=0)
            taken = usage.reserve(state.limits, who, wanted, request.url.path, context)
            if isinstance(taken, Response):  # concurrent requests took what the bucket held
                metrics.rate_limited.labels(who.tenant, "tokens").inc()
                return taken
            reservation = taken
        try:
            return await _forward(request, model, wanted, sent, reservation)
        finally:
            if reservation is not None:
                reservation.release()

    async def _forward(
        request: Request,
        model: Model,
        wanted: target.Target,
        sent: list[tuple[bytes, bytes]],
        reservation: usage.Reservation | None,
    ) -> Response | Passthrough:
        labels = model.key
        count = metrics.requests.labels
        body, resumable = wanted.body, wanted.resumable  # as target.for_replica() made them
        key = wanted.key
        tried: set[str] = set()
        # A continuation goes to the replica holding its conversation, or nowhere.
        held = None if wanted.pinned is None else stored.pinned(state, model, wanted.pinned)
        if isinstance(held, Response):
            return held
        for attempt in range(settings.retries + 1):
            endpoints = [e for e in held or state.usable(model) if e not in tried]
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
                if settings.backends:  # no operator starts a backend: holding would not help
                    count(*labels, "unavailable").inc()
                    return _with_retry_after(
                        503, f"No backend of the model {model.served!r} is ready", 1
                    )
                try:
                    ready = state.holds.until_ready(model, lambda: state.usable(model))
                    endpoints = await unless_disconnected(ready, request.receive)
                except OverloadedError as exc:
                    count(*labels, "overloaded").inc()
                    return _with_retry_after(429, str(exc), exc.retry_after)
                except StartingError as exc:
                    count(*labels, "draining" if state.draining else "starting").inc()
                    return _with_retry_after(503, str(exc), exc.retry_after)
                except ModelNotFoundError as exc:
                    count(*labels, "deleted").inc()
                    return from_exception(exc)
                except ClientDisconnect:
                    count(*labels, "client_closed").inc()
                    return Response(status_code=CLIENT_CLOSED)
            load = {e: state.loads.load(e) for e in endpoints}
            if model.adapter is not None:  # a replica with it in a slot, if one has room
                scraped = {e: state.loads.scraped(e) for e in endpoints}
                bound = state.balancer.bound(endpoints, load)
                endpoints = adapters.narrow(endpoints, model.adapter, scraped, load, bound)
            choice = state.balancer.pick(endpoints, load, key)
            metrics.routing.labels(*labels, choice.reason).inc()
            endpoint = choice.endpoint
            if attempt:
                metrics.retries.labels(*labels).inc()
            state.loads.begin(endpoint)
            started = time.perf_counter()
            try:
                assert state.client is not None  # opened by the lifespan, before any request
                send = open_upstream(
                    state.client,
                    endpoint,
                    request.url.path,
                    body,
                    headers.for_endpoint(sent, endpoint, settings.gateway_secret),
                    settings.upstream_timeout,
                )
                pending = asyncio.ensure_future(send)
                # With tokens to settle, a client that leaves does not end the request.
                upstream = await unless_disconnected(pending, request.receive, reservation is None)
            except ClientDisconnect:
                if reservation is None:
                    state.loads.end(endpoint)
                else:
                    ended = functools.partial(state.loads.end, endpoint)
                    usage.settle_when_answered(pending, reservation, ended)
                count(*labels, "client_closed").inc()
                return Response(status_code=CLIENT_CLOSED)
            except UpstreamTimeout:  # it may be generating: no retry, which could repeat it
                if reservation is not None:
                    reservation.keep()  # what it generated is unknown: the bound stands
                state.loads.end(endpoint)
                count(*labels, "upstream_timeout").inc()
                log.warning("replica %s of %s/%s sent nothing in time", endpoint, *labels)
                return error_response(
                    504,
                    f"The replica of {model.served!r} did not start answering within "
                    f"{settings.upstream_timeout:g} s",
                )
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
            path = request.url.path
            failover = Failover(state, model, key, path, body, sent, endpoint)
            done = _finish(failover, model, upstream.status)
            if not resumable:
                return Passthrough(
                    upstream, done, settings.upstream_idle_timeout, reservation=reservation
                )
            tracker = resume.Tracker(keep_ids=wanted.token_ids, room=resume.room(body))
            return Passthrough(
                upstream,
                done,
                settings.upstream_idle_timeout,
                tracker,
                failover,
                settings.max_resumes,
                reservation,
            )
        count(*labels, "upstream_error").inc()
        return _with_retry_after(
            503, f"No replica of the model {model.served!r} answered; retry the request", 1
        )

    def _finish(failover: Failover, model: Model, status: int) -> Callable[[str], None]:
        gauge = metrics.in_flight.labels(*model.key)
        gauge.inc()

        def done(outcome: str) -> None:
            state.in_flight -= 1
            gauge.dec()
            failover.end()  # the load of whichever replica holds the request now
            if outcome == "ok" and status >= 400:
                outcome = f"{status // 100}xx"
            metrics.requests.labels(*model.key, outcome).inc()

        return done

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "Internal server error")

    return Starlette(
        middleware=[
            Middleware(
                ApiKeyMiddleware,
                keys=settings.api_keys,
                limits=state.limits,
                refused=lambda tenant, limit: metrics.rate_limited.labels(tenant, limit).inc(),
            )
        ],
        exception_handlers={Exception: unexpected},
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/embeddings", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            # By model, as the others; their streams are not moved mid-answer (resume.py
            # speaks chat completion chunks), and a continuation of a stored response goes to
            # the replica that holds it (stored.py).
            Route("/v1/responses", complete, methods=["POST"]),
            *stored.stored_routes(state),
            Route("/v1/messages", complete, methods=["POST"]),
            Route("/v1/messages/count_tokens", complete, methods=["POST"]),
            *status_routes(state),
        ],
    )


# The streams resume.py can move to another replica mid-answer: chat and text completions'.
RESUMABLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def _refused(exc: KvpilotError) -> Response:
    response = from_exception(exc)
    if isinstance(exc, OverloadedError):  # the budget refused a body mid-read: it is unread
        response.headers["Connection"] = "close"
    return response


def _with_retry_after(status: int, message: str, seconds: int) -> Response:
    return error_response(status, message, headers={"Retry-After": str(seconds)})
