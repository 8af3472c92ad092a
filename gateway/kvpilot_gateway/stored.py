"""Stored responses behind the gateway (the Responses API's `store`): a continuation
(`previous_response_id`), and a GET or DELETE of a stored response, reach the replica that
holds it, named by the tag in its id (kvpilot_common.stored_ids), whatever the balancer would
pick; never another replica, which would not find it. The gateway keeps nothing: the id says
where, so every gateway replica, and a restarted one, routes alike.

An id whose replica is not among the ready ones (replaced or scaled down: a new pod has a new
address, so a new tag; or not ready now) is a 404 that says so, answered by the gateway at
once: the gateway cannot tell a replica gone from one that will be back, and a client waiting
for one that is gone would wait for ever. One that is ready but failed its last exchange is a
503 to retry. An untagged id (made with no gateway in front, or by a gateway without the secret,
whose replicas do not believe its tag) is routed as any request.
"""

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from kvpilot_common import stored_ids
from kvpilot_common.errors import NotFoundError
from kvpilot_common.http.errors import error_response, from_exception
from kvpilot_gateway import headers
from kvpilot_gateway.catalog import Model
from kvpilot_gateway.proxy import (
    CLIENT_CLOSED,
    UPSTREAM_ERRORS,
    Passthrough,
    UpstreamTimeout,
    open_upstream,
    unless_disconnected,
)
from kvpilot_gateway.state import State


def holder(endpoints: list[str], tag: str) -> str | None:
    """Which of these replicas has the tag."""
    return next((e for e in endpoints if stored_ids.replica_tag(e) == tag), None)


def gone(what: str, where: str) -> Response:
    return from_exception(
        NotFoundError(
            f"No stored response {what} on a replica serving now: the replica that stored "
            "it has left (replaced, scaled down or restarted: the conversation went with it) "
            "or is not ready; send the whole conversation as input to go on",
            where,
        )
    )


def not_answering(served: str) -> Response:
    return error_response(
        503,
        f"The replica of {served!r} that holds this stored response is not answering now; "
        "retry the request",
        headers={"Retry-After": "1"},
    )


def pinned(state: State, model: Model, tag: str) -> list[str] | Response:
    """The one replica a continuation may go to, or the answer when none can take it."""
    endpoint = holder(state.catalog.endpoints(model.key), tag)
    if endpoint is None:
        state.metrics.requests.labels(*model.key, "4xx").inc()
        return gone(f"for previous_response_id on {model.served!r}", "previous_response_id")
    if state.loads.is_down(endpoint):
        state.metrics.requests.labels(*model.key, "unavailable").inc()
        return not_answering(model.served)
    return [endpoint]


def _holding(state: State, tag: str) -> tuple[Model, str] | None:
    """The replica with the tag, of any model, and its model."""
    for model in list(state.catalog.models.values()):
        endpoint = holder(state.catalog.endpoints(model.key), tag)
        if endpoint is not None:
            return model, endpoint
    return None


def stored_routes(state: State) -> list[Route]:
    settings, metrics = state.settings, state.metrics

    async def forward(request: Request) -> Response | Passthrough:
        """GET or DELETE of a stored response (or its input items), at its replica."""
        if state.draining:
            return error_response(
                503, "Draining: this gateway replica is shutting down", headers={"Retry-After": "1"}
            )
        response_id = request.path_params["response_id"]
        tag = stored_ids.tag_of(response_id)
        found = _holding(state, tag) if tag is not None else None
        if found is None:
            metrics.unrouted.labels("NotFoundError").inc()
            if tag is None:
                return from_exception(
                    NotFoundError(
                        f"No stored response {response_id!r} behind this gateway: the gateway "
                        "finds a stored response by the replica its id names, and this id names "
                        "none (ids are named so when the gateway and its replicas share the "
                        "gateway secret)",
                        "response_id",
                    )
                )
            return gone(repr(response_id), "response_id")
        model, endpoint = found
        labels = model.key
        if state.loads.is_down(endpoint):
            metrics.requests.labels(*labels, "unavailable").inc()
            return not_answering(model.served)
        sent = headers.for_endpoint(
            headers.of_request(request, settings), endpoint, settings.gateway_secret
        )
        assert state.client is not None  # opened by the lifespan, before any request
        state.loads.begin(endpoint)
        state.in_flight += 1  # until the answer's last byte, for the drain
        try:
            send = open_upstream(
                state.client,
                endpoint,
                request.url.path,
                b"",
                sent,
                settings.upstream_timeout,
                request.method,
            )
            upstream = await unless_disconnected(send, request.receive)
        except ClientDisconnect:
            state.loads.end(endpoint)
            state.in_flight -= 1
            metrics.requests.labels(*labels, "client_closed").inc()
            return Response(status_code=CLIENT_CLOSED)
        except (UpstreamTimeout, *UPSTREAM_ERRORS):
            state.loads.end(endpoint)
            state.in_flight -= 1
            metrics.requests.labels(*labels, "upstream_error").inc()
            return not_answering(model.served)

        def done(outcome: str) -> None:
            state.loads.end(endpoint)
            state.in_flight -= 1
            if outcome == "ok" and upstream.status >= 400:
                outcome = f"{upstream.status // 100}xx"
            metrics.requests.labels(*labels, outcome).inc()

        return Passthrough(upstream, done, settings.upstream_idle_timeout)

    path = "/v1/responses/{response_id}"
    return [
        Route(path, forward, methods=["GET", "DELETE"]),
        Route(path + "/input_items", forward, methods=["GET"]),
    ]
