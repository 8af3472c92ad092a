"""/openapi.json: the API described from the same pydantic models that validate requests, so
the document cannot drift from what the server accepts."""

from importlib.metadata import version
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from kvpilot_server.api.embeddings import EmbeddingRequest
from kvpilot_server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

_REF = "#/components/schemas/{model}"
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
# What each kind of route can answer besides 200 (DESIGN.md: HTTP API).
_POST_ERRORS = {
    "400": "Invalid request, or the prompt and completion exceed the context window",
    "401": "Missing or wrong API key",
    "404": "Unknown model",
    "413": "Request body too large",
}
_GENERATE_ERRORS = {
    **_POST_ERRORS,
    "408": "The request's deadline passed; it was aborted",
    "429": "Too many requests waiting; see Retry-After",
    "503": "Draining or the engine is not running",
}


def _errors(codes: dict[str, str]) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}
    return {code: {"description": text, "content": content} for code, text in codes.items()}


def _post(model: type[BaseModel], summary: str, errors: dict[str, str], stream: bool) -> dict:
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    body = {"$ref": _REF.format(model=model.__name__)}
    return {
        "post": {
            "summary": summary,
            "operationId": model.__name__[0].lower() + model.__name__[1:],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "OK", "content": ok}, **_errors(errors)},
            "security": [{"bearer": []}, {}],
        }
    }


def _get(summary: str, security: bool, content_type: str = "application/json") -> dict:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": "OK", "content": {content_type: {}}}},
            "security": [{"bearer": []}, {}] if security else [],
        }
    }


def openapi_document(served_model_name: str) -> dict[str, Any]:
    models = [
        ChatCompletionRequest,
        CompletionRequest,
        EmbeddingRequest,
        TokenizeRequest,
        DetokenizeRequest,
    ]
    _, schemas = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kvpilot",
            "version": version("kvpilot"),
            "description": f"OpenAI-compatible API serving {served_model_name!r}. Every route "
            "but /health, /ready, /metrics and /openapi.json needs the bearer API key when the "
            "server has keys.",
        },
        "paths": {
            "/v1/chat/completions": _post(
                ChatCompletionRequest, "Chat completion", _GENERATE_ERRORS, stream=True
            ),
            "/v1/completions": _post(
                CompletionRequest, "Text completion", _GENERATE_ERRORS, stream=True
            ),
            "/v1/embeddings": _post(
                EmbeddingRequest, "Embeddings (an embedding model)", _GENERATE_ERRORS, False
            ),
            "/tokenize": _post(TokenizeRequest, "Token ids of a prompt", _POST_ERRORS, False),
            "/detokenize": _post(DetokenizeRequest, "Text of token ids", _POST_ERRORS, False),
            "/v1/models": _get("The served model", security=True),
            "/health": _get("200 while the engine loop runs", security=False),
            "/ready": _get("200 when loaded and not draining", security=False),
            "/metrics": _get("Prometheus metrics", security=False, content_type="text/plain"),
        },
        "components": {
            "schemas": {**schemas["$defs"], "ErrorResponse": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
