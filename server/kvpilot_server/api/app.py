"""The Starlette app: routes of the OpenAI-compatible API over the async engine."""

import json
import logging
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvpilot_server.api.admission import Admission
from kvpilot_server.api.auth import ApiKeyMiddleware
from kvpilot_server.api.completions import Completions
from kvpilot_server.api.context import drop_oldest_turns
from kvpilot_server.api.errors import error_response, from_exception, from_validation
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.openapi import openapi_document
from kvpilot_server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from kvpilot_server.engine.async_engine import AsyncEngine
from kvpilot_server.errors import InvalidRequestError

ContextOverflow = Literal["reject", "truncate-oldest"]
TRUNCATED_HEADER = "X-KVPilot-Dropped-Messages"
MAX_BODY_BYTES = 4 << 20
log = logging.getLogger(__name__)


def build_app(
    engine: AsyncEngine,
    served_model_name: str,
    api_keys: list[str] | None = None,
    admission: Admission | None = None,
    context_overflow: ContextOverflow = "reject",
) -> Starlette:
    tokenizer = engine.engine.tokenizer
    metrics = ServerMetrics(engine.engine, served_model_name)
    admission = admission or Admission(max_waiting=256, request_timeout=None)
    completions_api = Completions(engine, admission, metrics, served_model_name)

    async def parse(request: Request, model: type[BaseModel]) -> BaseModel | Response:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return error_response(413, f"Request body exceeds {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"Request body is not valid JSON: {exc}")
        if not isinstance(data, dict):
            return error_response(400, "Request body must be a JSON object")
        try:
            parsed = model.model_validate(data)
        except ValidationError as exc:
            return from_validation(exc)
        if parsed.model not in (None, served_model_name):
            return error_response(404, f"The model {parsed.model!r} does not exist", "model")
        return parsed

    async def chat(request: Request) -> Response:
        parsed = await parse(request, ChatCompletionRequest)
        if isinstance(parsed, Response):
            return parsed
        prompt, headers = chat_prompt([m.model_dump() for m in parsed.messages], parsed)
        return await completions_api.serve(request, parsed, prompt, chat=True, headers=headers)

    def chat_prompt(
        messages: list[dict], parsed: ChatCompletionRequest
    ) -> tuple[list[int], dict[str, str] | None]:
        """The prompt's token ids, after the context policy; headers that say what it did."""
        if context_overflow == "reject":
            return engine.engine.apply_chat_template(messages), None
        limit, room = engine.engine.max_model_len, parsed.requested_tokens or 1

        def fits(kept: list[dict]) -> bool:
            return len(engine.engine.apply_chat_template(kept)) + room <= limit

        messages, dropped = drop_oldest_turns(messages, fits)
        return engine.engine.apply_chat_template(messages), {TRUNCATED_HEADER: str(dropped)}

    async def completions(request: Request) -> Response:
        parsed = await parse(request, CompletionRequest)
        if isinstance(parsed, Response):
            return parsed
        return await completions_api.serve(request, parsed, parsed.prompt, chat=False)

    async def models(_: Request) -> Response:
        card = {"id": served_model_name, "object": "model", "created": 0, "owned_by": "kvpilot"}
        return JSONResponse({"object": "list", "data": [card]})

    document = openapi_document(served_model_name)

    async def schema(_: Request) -> Response:
        return JSONResponse(document)

    async def scrape(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def health(_: Request) -> Response:
        if not engine.alive:
            return error_response(503, "The engine loop is not running")
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if admission.draining:
            return error_response(503, "Draining: finishing in-flight requests before exit")
        return await health(request)

    async def invalid(_: Request, exc: Exception) -> Response:
        return from_exception(exc)

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "Internal server error")

    async def tokenize(request: Request) -> Response:
        parsed = await parse(request, TokenizeRequest)
        if isinstance(parsed, Response):
            return parsed
        if parsed.messages is not None:
            ids = engine.engine.apply_chat_template([m.model_dump() for m in parsed.messages])
        else:
            ids = tokenizer(parsed.prompt or "").input_ids
        limit = engine.engine.max_model_len
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": limit})

    async def detokenize(request: Request) -> Response:
        parsed = await parse(request, DetokenizeRequest)
        if isinstance(parsed, Response):
            return parsed
        return JSONResponse({"prompt": engine.engine.decode(parsed.tokens)})

    return Starlette(
        middleware=[Middleware(ApiKeyMiddleware, keys=api_keys or [])],
        # Bad input found outside the completion path (chat template, token ids) is a 400.
        exception_handlers={InvalidRequestError: invalid, Exception: unexpected},
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/metrics", scrape, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/openapi.json", schema, methods=["GET"]),
        ],
    )
