"""The Starlette app: the serving objects over the async engine, wired to the routes (routes.py).

Every body is read under a size limit and a read timeout, parsed and tokenized on worker
threads, and every route answers errors in OpenAI's shape. The event loop only moves bytes.
"""

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from kvpilot_common.errors import KvpilotError
from kvpilot_common.http.auth import ApiKeyMiddleware
from kvpilot_common.http.errors import error_response, from_exception
from kvpilot_common.http.keys import KeyBook
from kvpilot_common.http.rate_limit import RateLimits
from kvpilot_server.api.adapter_sync import AdapterSync
from kvpilot_server.api.adapters import Adapters
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.assistant import chat_template
from kvpilot_server.api.completions import Completions
from kvpilot_server.api.embeddings import Embeddings
from kvpilot_server.api.generation import CLIENT_CLOSED, Generation
from kvpilot_server.api.messages_api import errors as anthropic
from kvpilot_server.api.messages_api.serving import ServingMessages
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.openapi import openapi_document
from kvpilot_server.api.prompts import ContextOverflow
from kvpilot_server.api.request_scope import RequestScope
from kvpilot_server.api.responses_api.serving import ServingResponses
from kvpilot_server.api.responses_api.store import ResponseStore
from kvpilot_server.api.routes import ROUTES, Services
from kvpilot_server.api.serving import Intake
from kvpilot_server.api.serving_chat import ServingChat
from kvpilot_server.api.serving_completion import ServingCompletion
from kvpilot_server.engine.runtime.async_engine import AsyncEngine

log = logging.getLogger(__name__)


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
    """Wiring only: the serving objects, built once, in the app's state for the routes."""
    name = settings.served_model_name
    admission = Admission(
        settings.max_waiting,
        settings.request_timeout,
        lambda: engine.stats,
        engine.max_num_seqs,
        engine.fail_in_flight,
    )
    metrics = ServerMetrics(engine, name, admission)
    generation = Generation(engine, admission, metrics)
    completions = Completions(generation, name)
    template = chat_template(engine.inputs.tokenizer.chat_template, settings.tool_call_parser)
    adapters = Adapters(engine, name, settings.body_timeout, settings.lora_dir)
    sync = AdapterSync(adapters, settings.lora_config) if settings.lora_config else None
    intake = Intake(engine, adapters, settings.body_timeout, settings.gateway_secret)
    chat = ServingChat(intake, completions, adapters, template, settings.context_overflow)
    served = Services(
        name=name,
        engine=engine,
        admission=admission,
        metrics=metrics,
        adapters=adapters,
        template=template,
        intake=intake,
        chat=chat,
        completion=ServingCompletion(intake, completions),
        embeddings=Embeddings(engine, admission, metrics, name),
        messages=ServingMessages(intake, chat, generation, name),
        responses=ServingResponses(intake, chat, generation, name, ResponseStore()),
        document=openapi_document(name),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if sync is None:
            yield
            return
        async with sync.running():
            yield

    def shaped(request: Request, response: JSONResponse) -> JSONResponse:
        """An error in the shape of the API the request called (OpenAI's, or Anthropic's)."""
        if request.url.path.startswith(anthropic.PATH):
            return anthropic.reshaped(response)
        return response

    async def known(request: Request, exc: Exception) -> Response:
        return shaped(request, from_exception(exc))

    async def invalid_body(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ValidationError)
        return shaped(request, from_validation(exc))

    async def client_left(_: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the access log does

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return shaped(request, error_response(500, "Internal server error"))

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
                # The key check's 401 and 429 in the shape of the API called.
                shaped=lambda path, answer: (
                    anthropic.reshaped(answer) if path.startswith(anthropic.PATH) else answer
                ),
            ),
            Middleware(RequestScope),
        ],
        exception_handlers={
            KvpilotError: known,
            ValidationError: invalid_body,
            ClientDisconnect: client_left,
            Exception: unexpected,
        },
        routes=ROUTES,
    )
    app.state.services = served
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
