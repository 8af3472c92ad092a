"""Bodies and events held to the anthropic SDK's own types, strictly: every key must be one the
type declares (the SDK's models keep unknown keys aside; here that is a failure)."""

from typing import Any

import pydantic
from anthropic import BaseModel
from anthropic.types import Message, RawMessageStreamEvent

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
# This SDK release has no temperature argument (newer models fix it); kvpilot takes Anthropic's
# field, and greedy decoding makes two requests' answers comparable.
GREEDY = {"temperature": 0}


def unknown_keys(model: Any, where: str = "") -> list[str]:
    """Keys a model and the models inside it do not declare."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        found += [f"{where}.{k}" for k in (model.model_extra or {})]
        for name in type(model).model_fields:
            found += unknown_keys(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            found += unknown_keys(item, f"{where}.{i}")
    return found


def message(body: dict[str, Any]) -> Message:
    parsed = Message.model_validate(body)
    assert not unknown_keys(parsed), unknown_keys(parsed)
    return parsed


def event(body: dict[str, Any]) -> Any:
    parsed = EVENT.validate_python(body)
    assert not unknown_keys(parsed), unknown_keys(parsed)
    return parsed


def without_ids(content: list[Any]) -> list[dict[str, Any]]:
    """Content blocks as data, tool_use ids left out (they derive from the message's id)."""
    return [{k: v for k, v in b.model_dump().items() if k != "id"} for b in content]
