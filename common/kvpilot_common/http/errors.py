"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}; never a traceback."""

from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

from kvpilot_common.errors import (
    BodyTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RequestFailedError,
    RequestTimeoutError,
    UnavailableError,
)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The error as JSON data: the body of error_response(), and of an error event in a stream
    that has already started."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": HTTPStatus(status).phrase.lower().replace(" ", "_"),
        }
    }


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def from_exception(exc: Exception) -> JSONResponse:
    """Map the engine's own exceptions; anything else is a 500 with a generic message."""
    if isinstance(exc, InvalidRequestError):
        return error_response(400, str(exc), exc.param)
    if isinstance(exc, ModelNotFoundError):
        return error_response(404, str(exc), "model")
    if isinstance(exc, NotFoundError):
        return error_response(404, str(exc), exc.param)
    if isinstance(exc, PayloadTooLargeError | BodyTimeoutError):
        # The body was not read to its end, so the connection cannot carry another request.
        status = 413 if isinstance(exc, PayloadTooLargeError) else 408
        return error_response(status, str(exc), headers={"Connection": "close"})
    if isinstance(exc, OverloadedError):
        return error_response(429, str(exc), headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, RequestTimeoutError):
        return error_response(408, str(exc))
    if isinstance(exc, UnavailableError):
        return error_response(503, str(exc))
    if isinstance(exc, RequestFailedError):
        return error_response(500, str(exc))
    return error_response(500, "Internal server error")
