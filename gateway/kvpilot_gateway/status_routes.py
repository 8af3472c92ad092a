"""The gateway's own answers: the model list (with whether each can answer now), /metrics and
the probes. Everything else is forwarded (app.py)."""

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvpilot_common.http.errors import error_response
from kvpilot_gateway.state import State


def status_routes(state: State) -> list[Route]:
    settings, catalog, metrics = state.settings, state.catalog, state.metrics

    async def models(_: Request) -> Response:
        cards = []
        for name, model in catalog.listed():
            ready = len(state.usable(model))
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
            if model.parent is not None:  # an adapter, listed as a vLLM server lists one
                cards[-1]["parent"] = model.parent
        return JSONResponse({"object": "list", "data": cards})

    async def scrape(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(_: Request) -> Response:
        if state.draining:
            return error_response(503, "Draining: finishing in-flight requests before exit")
        if not state.synced:
            return error_response(
                503,
                "Probing the backends"
                if settings.backends
                else "Listing ModelDeployments and their endpoints",
            )
        return JSONResponse({"status": "ok"})

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", scrape, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
    ]
