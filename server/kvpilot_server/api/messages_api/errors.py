"""Errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}}, with the HTTP
status and headers (Retry-After, Connection: close...) of kvpilot's own answer. Every error
on the Messages routes is made in OpenAI's shape first (kvpilot_common.http.errors, the one
place that maps kvpilot's exceptions) and reshaped here."""

import json
from typing import Any

from starlette.responses import JSONResponse

from kvpilot_common.http.errors import from_exception as openai_shaped

PATH = "/v1/messages"  # the routes whose errors are in Anthropic's shape

# Anthropic's error types by status (its API's table; 408 and 503 are kvpilot's own).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_DROPPED = {"content-length", "content-type"}  # the new body's own


def error_body(status: int, message: str) -> dict[str, Any]:
    """The error as JSON data: a response's body, or a stream's `error` event."""
    kind = TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def reshaped(response: JSONResponse) -> JSONResponse:
    """An error response in OpenAI's shape (kvpilot_common.http.errors) in Anthropic's."""
    try:
        message = json.loads(bytes(response.body))["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response  # not an OpenAI-shaped error: nothing to reshape
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _DROPPED}
    status = response.status_code
    return JSONResponse(error_body(status, str(message)), status_code=status, headers=headers)


def from_exception(exc: Exception) -> JSONResponse:
    return reshaped(openai_shaped(exc))


def stream_error(exc: Exception) -> dict[str, Any]:
    """A stream's `error` event for a failure after it began (its status is already 200)."""
    response = openai_shaped(exc)
    return error_body(response.status_code, json.loads(bytes(response.body))["error"]["message"])
