"""The Starlette app: routes of the OpenAI-compatible API over the async engine.

Every body is read under a size limit and a read timeout, parsed and tokenized on worker
threads, and every route answers errors in OpenAI's shape. The event loop only moves bytes.
"""

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvpilot_common import trust
from kvpilot_common.errors import InvalidRequestError, KvpilotError
from kvpilot_common.http.auth import ApiKeyMiddleware
from kvpilot_common.http.body import read_body
from kvpilot_common.http.errors import error_response, from_exception
from kvpilot_common.http.keys import KeyBook
from kvpilot_common.http.rate_limit import RateLimits
from kvpilot_server.api.adapter_sync import AdapterSync
from kvpilot_server.api.adapters import Adapters
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.assistant import chat_shape, chat_template
from kvpilot_server.api.completions import CLIENT_CLOSED, Completions
from kvpilot_server.api.embeddings import EmbeddingRequest, Embeddings
from kvpilot_server.api.fields import (
    REFUSED_CHAT,
    REFUSED_COMPLETIONS,
    check_extras,
    ignored_header,
)
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.openapi import openapi_document
from kvpilot_server.api.prompts import ContextOverflow, chat_prompt, text_prompt
from kvpilot_server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeRequest,
)
from kvpilot_server.api.request_scope import RequestScope
from kvpilot_server.engine.runtime.async_engine import AsyncEngine

TRUNCATED_HEADER = "X-KVPilot-Dropped-Messages"
log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


@dataclass
class ServerSettings:
    """What `kvpilot serve` sets beyond the engine (see its --help)."""

    served_model_name: str
    api_keys: KeyBook | list[str] | None = None  # a list: keys without names or limits
    max_waiting: int = 256
    request_timeout: float | None = None  # seconds; a ceiling on a request's own `timeout`
    context_overflow: ContextOverflow = "reject"
    body_timeout: float | None = 30.0  # seconds without body data before a 408
    tool_call_parser: str = "auto"  # a tools.FORMATS name, or auto: from the chat template
    # The directory run-time adapter loads are confined to; None: the load routes are off.
    lora_dir: Path | None = None
    # A list of adapters to follow (api/adapter_sync.py); None: none.
    lora_config: Path | None = None
    # What kvpilot's gateway proves itself with (kvpilot_common.trust); None: kvpilot_continue
    # is refused and a forwarded tenant is not believed.
    gateway_secret: str | None = None


def build_app(engine: AsyncEngine, settings: ServerSettings) -> Starlette:
    name = settings.served_model_name
    admission = Admission(
        settings.max_waiting,
        settings.request_timeout,
        lambda: engine.stats,
        engine.max_num_seqs,
        engine.fail_in_flight,
    )
    metrics = ServerMetrics(engine, name, admission)
    completions_api = Completions(engine, admission, metrics, name)
    embeddings_api = Embeddings(engine, admission, metrics, name)
    inputs = engine.inputs
    template = chat_template(inputs.tokenizer.chat_template, settings.tool_call_parser)
    adapters = Adapters(engine, name, settings.body_timeout, settings.lora_dir)
    sync = AdapterSync(adapters, settings.lora_config) if settings.lora_config else None

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if sync is None:
            yield
            return
        async with sync.running():
            yield

    async def parse(request: Request, model: type[M]) -> M:
        body = await read_body(request, settings.body_timeout)
        parsed = await engine.process(model.model_validate_json, body)
        adapters.resolve(parsed.model)  # type: ignore[attr-defined] - 404 for an unknown one
        return parsed

    def continuing(request: Request, parsed: SamplingFields) -> None:
        """kvpilot_continue only from the gateway: with the secret, for one choice."""
        if parsed.kvpilot_continue is None:
            return
        sent = request.headers.get(trust.HEADER)
        if not trust.authorized(sent, settings.gateway_secret):
            raise InvalidRequestError(
                "kvpilot_continue is for kvpilot's gateway, which sends this server's "
                "gateway secret; this request did not",
                "kvpilot_continue",
            )
        if parsed.n != 1:
            raise InvalidRequestError("kvpilot_continue takes one choice (n=1)", "n")

    def generating() -> None:
        if engine.task == "embed":
            raise InvalidRequestError(
                "This model is an embedding model: it serves /v1/embeddings only", "model"
            )

    async def chat(request: Request) -> Response:
        parsed = await parse(request, ChatCompletionRequest)
        generating()
        headers = ignored_header(check_extras(parsed, REFUSED_CHAT))
        plan = parsed.tool_plan()
        messages, tools = template.prompt_messages(parsed.template_messages(), plan)
        policy, room = settings.context_overflow, parsed.requested_tokens
        variables = parsed.template_kwargs()
        prompt, dropped = await engine.process(
            chat_prompt, inputs, messages, room, policy, tools, variables
        )
        if dropped is not None:
            headers[TRUNCATED_HEADER] = str(dropped)
        shape = chat_shape(template, plan, inputs.tokenizer.decode(prompt[-8:]))
        reasoning = template.reasoning
        parsed.constrain(
            shape.tools,
            plan,
            (reasoning.start, reasoning.end) if reasoning is not None else None,
            shape.opened,
        )
        lora = adapters.resolve(parsed.model)
        continuing(request, parsed)
        return await completions_api.serve(
            request, parsed, prompt, chat=True, headers=headers, shape=shape, lora=lora
        )

    async def completions(request: Request) -> Response:
        parsed = await parse(request, CompletionRequest)
        generating()
        headers = ignored_header(check_extras(parsed, REFUSED_COMPLETIONS))
        prompt = await engine.process(text_prompt, inputs, parsed.prompt, parsed.max_tokens)
        lora = adapters.resolve(parsed.model)
        continuing(request, parsed)
        return await completions_api.serve(
            request, parsed, prompt, chat=False, headers=headers, lora=lora
        )

    async def embeddings(request: Request) -> Response:
        parsed = await parse(request, EmbeddingRequest)
        if adapters.resolve(parsed.model) is not None:
            raise InvalidRequestError("LoRA adapters serve generation, not embeddings", "model")
        return await embeddings_api.serve(request, parsed)

    def tokenized(parsed: TokenizeRequest) -> JSONResponse:
        """On a worker thread: a long prompt's JSON answer is large to render too."""
        if parsed.messages is not None:
            messages = [m.template_message(f"messages.{i}") for i, m in enumerate(parsed.messages)]
            ids = inputs.chat(*template.prompt_messages(messages, None))
        else:
            ids = inputs.tokenizer(parsed.prompt or "").input_ids
        limit = engine.max_model_len
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": limit})

    async def tokenize(request: Request) -> Response:
        return await engine.process(tokenized, await parse(request, TokenizeRequest))

    async def detokenize(request: Request) -> Response:
        parsed = await parse(request, DetokenizeRequest)
        return JSONResponse({"prompt": await engine.process(inputs.decode, parsed.tokens)})

    async def models(_: Request) -> Response:
        card = {"id": name, "object": "model", "created": 0, "owned_by": "kvpilot"}
        card["task"] = engine.task  # generate or embed: which routes the model serves
        return JSONResponse({"object": "list", "data": [card, *adapters.cards(0)]})

    document = openapi_document(name)

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

    async def known(_: Request, exc: Exception) -> Response:
        return from_exception(exc)

    async def invalid_body(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ValidationError)
        return from_validation(exc)

    async def client_left(_: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the access log does

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "Internal server error")

    app = Starlette(
        lifespan=lifespan,
        # RequestScope inside the key check: a refused request holds nothing to release.
        middleware=[
            Middleware(
                ApiKeyMiddleware,
                keys=KeyBook.of(keys) if isinstance(keys := settings.api_keys, list) else keys,
                limits=RateLimits(),
                gateway_secret=settings.gateway_secret,
                refused=metrics.refused,
            ),
            Middleware(RequestScope),
        ],
        exception_handlers={
            KvpilotError: known,
            ValidationError: invalid_body,
            ClientDisconnect: client_left,
            Exception: unexpected,
        },
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/load_lora_adapter", adapters.load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", adapters.unload, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/metrics", scrape, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/openapi.json", schema, methods=["GET"]),
        ],
    )
    app.state.admission = admission  # the server's drain waits for it to empty
    app.state.adapters = adapters  # `kvpilot serve` adds --lora-modules through it
    app.state.adapter_sync = sync  # and reads the list once before it listens
    return app


def from_validation(exc: ValidationError) -> JSONResponse:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "json_invalid":
        return error_response(400, f"Request body is not valid JSON: {first['msg']}")
    if where is None and first["type"] == "model_type":
        return error_response(400, "Request body must be a JSON object")
    return error_response(400, f"{where}: {first['msg']}" if where else first["msg"], where)
