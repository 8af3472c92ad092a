"""Errors in Anthropic's shape: being written (issue 53)."""

from starlette.responses import JSONResponse

PATH = "/v1/messages"  # the routes whose errors are in Anthropic's shape


def reshaped(response: JSONResponse) -> JSONResponse:
    """An error response in OpenAI's shape (kvpilot_common.http.errors) in Anthropic's."""
    return response
