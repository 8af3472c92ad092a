"""The server's routes: thin functions over the serving objects build_app puts in the app's
state (`Services`), one per path. The generation APIs' work is their serving objects'."""

from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvpilot_common.errors import InvalidRequestError
from kvpilot_common.http.errors import error_response
from kvpilot_server.api.adapters import Adapters
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.assistant import ChatTemplate
from kvpilot_server.api.embeddings import EmbeddingRequest, Embeddings
from kvpilot_server.api.messages_api.serving import ServingMessages
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.protocol import DetokenizeRequest, TokenizeRequest
from kvpilot_server.api.responses_api.serving import ServingResponses
from kvpilot_server.api.serving import Intake
from kvpilot_server.api.serving_chat import ServingChat
from kvpilot_server.api.serving_completion import ServingCompletion
from kvpilot_server.engine.runtime.async_engine import AsyncEngine


@dataclass
class Services:
    """Everything the routes reach, built once by build_app."""

    name: str  # the served model's name
    engine: AsyncEngine
    admission: Admission
    metrics: ServerMetrics
    adapters: Adapters
    template: ChatTemplate
    intake: Intake
    chat: ServingChat
    completion: ServingCompletion
    embeddings: Embeddings
    messages: ServingMessages
    responses: ServingResponses
    document: dict[str, Any]  # /openapi.json


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def chat(request: Request) -> Response:
    return await services(request).chat.create(request)


async def completions(request: Request) -> Response:
    return await services(request).completion.create(request)


async def create_response(request: Request) -> Response:
    return await services(request).responses.create(request)


async def retrieve_response(request: Request) -> Response:
    return await services(request).responses.retrieve(request)


async def delete_response(request: Request) -> Response:
    return await services(request).responses.delete(request)


async def response_input_items(request: Request) -> Response:
    return await services(request).responses.input_items(request)


async def messages(request: Request) -> Response:
    return await services(request).messages.create(request)


async def count_tokens(request: Request) -> Response:
    return await services(request).messages.count_tokens(request)


async def embeddings(request: Request) -> Response:
    served = services(request)
    parsed = await served.intake.parse(request, EmbeddingRequest)
    if served.adapters.resolve(parsed.model) is not None:
        raise InvalidRequestError("LoRA adapters serve generation, not embeddings", "model")
    return await served.embeddings.serve(request, parsed)


def _tokenized(served: Services, parsed: TokenizeRequest) -> JSONResponse:
    """On a worker thread: a long prompt's JSON answer is large to render too."""
    inputs = served.engine.inputs
    if parsed.messages is not None:
        messages = [m.template_message(f"messages.{i}") for i, m in enumerate(parsed.messages)]
        ids = inputs.chat(*served.template.prompt_messages(messages, None))
    else:
        ids = inputs.tokenizer(parsed.prompt or "").input_ids
    limit = served.engine.max_model_len
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": limit})


async def tokenize(request: Request) -> Response:
    served = services(request)
    parsed = await served.intake.parse(request, TokenizeRequest)
    return await served.engine.process(_tokenized, served, parsed)


async def detokenize(request: Request) -> Response:
    served = services(request)
    parsed = await served.intake.parse(request, DetokenizeRequest)
    text = await served.engine.process(served.engine.inputs.decode, parsed.tokens)
    return JSONResponse({"prompt": text})


async def models(request: Request) -> Response:
    served = services(request)
    card = {"id": served.name, "object": "model", "created": 0, "owned_by": "kvpilot"}
    card["task"] = served.engine.task  # generate or embed: which routes the model serves
    return JSONResponse({"object": "list", "data": [card, *served.adapters.cards(0)]})


async def load_adapter(request: Request) -> Response:
    return await services(request).adapters.load(request)


async def unload_adapter(request: Request) -> Response:
    return await services(request).adapters.unload(request)


async def schema(request: Request) -> Response:
    return JSONResponse(services(request).document)


async def scrape(request: Request) -> Response:
    registry = services(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def health(request: Request) -> Response:
    if not services(request).engine.alive:
        return error_response(503, "The engine loop is not running")
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    if services(request).admission.draining:
        return error_response(503, "Draining: finishing in-flight requests before exit")
    return await health(request)


ROUTES = [
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", response_input_items, methods=["GET"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/load_lora_adapter", load_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_adapter, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/metrics", scrape, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/openapi.json", schema, methods=["GET"]),
]
