"""The Starlette app: OpenAI-compatible completions over the async engine.

Bad input is answered before any streaming starts (the first engine output is awaited first),
so a client sees either a clean 4xx JSON error or a stream, never a stream that breaks.
A client that goes away mid-stream closes the response's generator, which aborts the request.
"""

import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvpilot_server.api import responses
from kvpilot_server.api.access_log import log_request
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.auth import ApiKeyMiddleware
from kvpilot_server.api.errors import error_response, from_exception, from_validation
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from kvpilot_server.engine.async_engine import AsyncEngine
from kvpilot_server.errors import InvalidRequestError, OverloadedError
from kvpilot_server.outputs import RequestOutput

MAX_BODY_BYTES = 4 << 20
log = logging.getLogger(__name__)


def build_app(
    engine: AsyncEngine,
    served_model_name: str,
    api_keys: list[str] | None = None,
    admission: Admission | None = None,
) -> Starlette:
    tokenizer = engine.engine.tokenizer
    metrics = ServerMetrics(engine.engine, served_model_name)

    def finished(request_id: str, status: int, output, outcome: str) -> None:
        metrics.observe_finished(output, outcome)
        log_request(request_id, status, output, outcome)

    admission = admission or Admission(max_waiting=256, request_timeout=None)

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
        messages = [m.model_dump() for m in parsed.messages]
        return await complete(parsed, engine.engine.apply_chat_template(messages), chat=True)

    async def completions(request: Request) -> Response:
        parsed = await parse(request, CompletionRequest)
        if isinstance(parsed, Response):
            return parsed
        return await complete(parsed, parsed.prompt, chat=False)

    async def complete(parsed, prompt: str | list[int], chat: bool) -> Response:
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        envelope = responses.Envelope(request_id, served_model_name, chat)
        to_logprobs = responses.chat_logprobs if chat else responses.completion_logprobs
        try:
            params = parsed.engine_params()
            admission.admit(running=sum(engine.engine.stats().running.values()))
            stream = admission.track(
                engine.generate(prompt, params, request_id, parsed.scheduling_class()),
                parsed.timeout,
            )
            first = await anext(stream)
        except Exception as exc:
            response = from_exception(exc)
            rejected = isinstance(exc, InvalidRequestError | OverloadedError)
            finished(request_id, response.status_code, None, "rejected" if rejected else "error")
            return response
        wants_logprobs = params.logprobs is not None
        if not parsed.stream:
            last = first
            try:
                async for last in stream:  # noqa: B007 - only the final output is needed
                    pass
            except Exception as exc:
                response = from_exception(exc)
                finished(request_id, response.status_code, last, "error")
                return response
            finished(request_id, 200, last, last.outputs[0].finish_reason or "error")
            samples = last.outputs[0].logprobs if wants_logprobs else None
            logprobs = to_logprobs(samples, tokenizer) if samples is not None else None
            return JSONResponse(envelope.full(last, logprobs))
        events = _sse(
            first,
            stream,
            envelope,
            parsed.include_usage,
            (lambda s: to_logprobs(s, tokenizer)) if wants_logprobs else None,
            functools.partial(finished, request_id, 200),
        )
        return StreamingResponse(events, media_type="text/event-stream")

    async def models(_: Request) -> Response:
        card = {"id": served_model_name, "object": "model", "created": 0, "owned_by": "kvpilot"}
        return JSONResponse({"object": "list", "data": [card]})

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
        return JSONResponse({"prompt": tokenizer.decode(parsed.tokens)})

    return Starlette(
        middleware=[Middleware(ApiKeyMiddleware, keys=api_keys or [])],
        exception_handlers={Exception: unexpected},
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/metrics", scrape, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
        ],
    )


async def _sse(
    first: RequestOutput,
    rest: AsyncIterator[RequestOutput],
    envelope: responses.Envelope,
    include_usage: bool,
    to_logprobs: Callable[[list], dict] | None,
    finished: Callable[[RequestOutput, str], None],
) -> AsyncIterator[str]:
    def event(body: dict[str, Any]) -> str:
        return f"data: {json.dumps(body)}\n\n"

    sent, last, is_first = 0, first, True
    try:
        output: RequestOutput | None = first
        while output is not None:
            completion = output.outputs[0]
            samples = (completion.logprobs or [])[sent:]
            sent += len(samples)
            logprobs = to_logprobs(samples) if to_logprobs and samples else None
            if completion.delta_text or output.finished or is_first:
                yield event(envelope.chunk(completion.delta_text, output, logprobs, is_first))
                is_first = False
            last, output = output, await anext(rest, None)
    except Exception as exc:  # mid-stream failure: say so in the stream, in OpenAI's shape
        finished(last, "error")
        yield event(json.loads(from_exception(exc).body))
    except BaseException:  # the client went away (cancellation): the engine aborts the request
        finished(last, "abort")
        raise
    else:
        finished(last, last.outputs[0].finish_reason or "error")
        if include_usage:
            yield event(envelope.usage_chunk(last))
    yield "data: [DONE]\n\n"
