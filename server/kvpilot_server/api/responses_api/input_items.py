"""GET /v1/responses/{id}/input_items: the input a stored response was made from, as the
Responses API lists it (the request's own items, not those of the responses it continued),
newest first unless `order=asc`, in pages of `limit` after the item `after` names. Items are
kept as the client sent them, with what the API's item types require added: an id (clients
send back items they received, ids and all: those are kept), a status, and content as parts."""

import uuid
from typing import Any

from starlette.datastructures import QueryParams

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.responses_api.request import ResponsesRequest

Body = dict[str, Any]
# The id prefix of each item type, as OpenAI's own ids begin.
_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
DEFAULT_LIMIT, MAX_LIMIT = 20, 100  # OpenAI's page sizes


def input_items(parsed: ResponsesRequest) -> list[Body]:
    if isinstance(parsed.input, str):
        return [_item({"type": "message", "role": "user", "content": parsed.input})]
    return [_item(item.model_dump()) for item in parsed.input]


def _item(raw: Body) -> Body:
    kind = raw.get("type", "message")
    item = {"id": f"{_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}", "type": kind, **raw}
    if kind in ("message", "function_call", "function_call_output"):
        item.setdefault("status", "completed")
    if kind == "reasoning":
        item.setdefault("summary", [])
    if kind == "message":
        item["content"] = _parts(item["content"], item.get("role"))
    return item


def _parts(content: str | list[Body], role: object) -> list[Body]:
    if isinstance(content, str):
        content = [
            {"type": "output_text" if role == "assistant" else "input_text", "text": content}
        ]
    parts = [{k: v for k, v in part.items() if v is not None} for part in content]
    for part in parts:
        if part["type"] == "output_text":
            part.setdefault("annotations", [])
    return parts


def page(items: list[Body], query: QueryParams) -> Body:
    """One page of the list, as the query asks: `order`, `limit`, `after`. `include` names
    extra fields of hosted tools and images, which kvpilot's items never hold: refused."""
    if query.get("include"):
        raise InvalidRequestError(
            "include: kvpilot's input items hold no extra fields to include (they are of "
            "hosted tools, images and logprobs, which kvpilot does not store)",
            "include",
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError(f"order: 'asc' or 'desc', not {order!r}", "order")
    raw = query.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequestError(f"limit: from 1 to {MAX_LIMIT}, not {raw!r}", "limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == after), None)
        if at is None:
            raise InvalidRequestError(f"after: no input item {after!r} in this response", "after")
        ordered = ordered[at + 1 :]
    shown = ordered[: int(raw)]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(ordered) > len(shown),
    }
