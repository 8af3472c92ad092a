"""Is a structured answer what the request asked for? OpenAI's semantics, checked on the client.

A request asked for one of (workload.Variant):
- `response_format` json_schema: the answer's `message.content` must parse as JSON and validate
  against the schema (the `jsonschema` library, the schema's own draft, 2020-12 by default);
  json_object: it must parse as a JSON object.
- `tools`: every call in `message.tool_calls` must name a tool that was offered and carry
  `arguments` that parse as JSON and validate against that tool's `parameters`; `tool_choice`
  must be respected: `required` means at least one call, a named function means calls of that
  function only. With `auto` (or none given) an answer without calls is valid.
An answer cut by the token limit (finish_reason `length`) is `truncated` whatever it holds: it
ended because the budget did, not because the answer was complete.

Failure kinds, the first that applies: truncated, not_json, schema_mismatch (content), then
no_tool_call, wrong_tool, bad_arguments (tool calls). Streamed answers are first put together
from their deltas (Reassembly), the way OpenAI's client does it.
"""

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jsonschema

from kvpilot_bench.workload import Variant

FAILURES = (
    "not_json",  # content that does not parse as JSON
    "schema_mismatch",  # content that parses but does not meet the schema
    "no_tool_call",  # tool_choice required or named, and no call
    "wrong_tool",  # a call of a tool not offered, or not the one tool_choice named
    "bad_arguments",  # a call's arguments do not parse, or do not meet its parameters
    "truncated",  # finish_reason length
)
_DETAIL = 200  # characters of a failure's explanation kept


@dataclass
class Answer:
    """What a chat completion's first choice said, whole."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None

    @classmethod
    def from_message(cls, choice: dict[str, Any]) -> "Answer":
        """A non-streamed answer's choices[0]."""
        choice = choice if isinstance(choice, dict) else {}
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        content, calls = message.get("content"), message.get("tool_calls")
        return cls(
            content=content if isinstance(content, str) else None,
            tool_calls=[c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else [],
            finish_reason=choice.get("finish_reason"),
        )


class Reassembly:
    """A streamed choice put back together from its deltas: content appended, each tool call
    (by its `index`) created by its first fragment, its name and arguments appended after."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def add(self, choice: dict[str, Any]) -> bool:
        """One chunk's choice; True when it carried generated text (content or a call's
        name or arguments)."""
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        text = False
        if isinstance(delta.get("content"), str) and delta["content"]:
            self.content.append(delta["content"])
            text = True
        fragments = delta.get("tool_calls")
        for fragment in fragments if isinstance(fragments, list) else []:
            if not isinstance(fragment, dict):
                continue
            call = self._call(fragment)
            if isinstance(fragment.get("type"), str):
                call["type"] = fragment["type"]
            function = fragment.get("function")
            function = function if isinstance(function, dict) else {}
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str) and function[key]:
                    call["function"][key] += function[key]
                    text = True
        return text

    def _call(self, fragment: dict[str, Any]) -> dict[str, Any]:
        index = fragment.get("index")
        if not isinstance(index, int):  # servers that leave the index out: a new id, a new call
            last = max(self.calls, default=-1)
            new_id = fragment.get("id")
            new = last < 0 or bool(new_id and new_id != self.calls[last]["id"])
            index = len(self.calls) if new else last
        if index not in self.calls:
            self.calls[index] = {
                "id": fragment.get("id") or "",
                "type": "function",
                "function": {"name": "", "arguments": ""},
            }
        elif fragment.get("id") and not self.calls[index]["id"]:
            self.calls[index]["id"] = fragment["id"]
        return self.calls[index]

    def answer(self) -> Answer:
        return Answer(
            content="".join(self.content) if self.content else None,
            tool_calls=[self.calls[i] for i in sorted(self.calls)],
            finish_reason=self.finish_reason,
        )


def check(variant: Variant, answer: Answer) -> tuple[str | None, str | None]:
    """(None, None) for a valid answer, else (failure kind, why in a few words)."""
    if answer.finish_reason == "length":
        return "truncated", "finish_reason length: the answer hit max_tokens"
    schema = variant.schema
    if schema is not None:
        return _content(schema, answer.content)
    return _tool_calls(variant, answer)


def _content(schema: dict[str, Any], content: str | None) -> tuple[str | None, str | None]:
    if content is None:
        return "not_json", "no content"
    try:
        value = _loads(content)
    except ValueError as exc:
        return "not_json", _short(f"{exc}: {content[:80]!r}")
    problem = _mismatch(schema, value)
    return ("schema_mismatch", problem) if problem else (None, None)


def _tool_calls(variant: Variant, answer: Answer) -> tuple[str | None, str | None]:
    calls, forced = answer.tool_calls, variant.forced_tool
    if not calls:
        if variant.tool_choice == "required" or forced is not None:
            return "no_tool_call", _short(f"tool_choice {variant.tool_choice} and no tool call")
        return None, None  # auto: answering in words is allowed
    offered = variant.parameters()
    functions: list[dict[str, Any]] = [
        f if isinstance(f := c.get("function"), dict) else {} for c in calls
    ]
    names = [str(f.get("name")) for f in functions]
    for name in names:
        if name not in offered:
            return "wrong_tool", _short(f"called {name!r}, offered {sorted(offered)}")
        if forced is not None and name != forced:
            return "wrong_tool", _short(f"called {name!r}, tool_choice named {forced!r}")
    for function, name in zip(functions, names, strict=True):
        arguments = function.get("arguments")
        try:
            value = _loads(arguments) if isinstance(arguments, str) else None
        except ValueError as exc:
            return "bad_arguments", _short(f"{name}: {exc}")
        if value is None:
            return "bad_arguments", _short(f"{name}: arguments are not a JSON string")
        problem = _mismatch(offered[name], value)
        if problem:
            return "bad_arguments", _short(f"{name}: {problem}")
    return None, None


def _loads(text: str) -> Any:
    """JSON as RFC 8259 has it: Python's NaN and Infinity extensions refused."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _mismatch(schema: dict[str, Any], value: Any) -> str | None:
    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema)).iter_errors(value))
    if error is None:
        return None
    at = "/".join(str(p) for p in error.absolute_path) or "(top)"
    return _short(f"{at}: {error.message}")


@cache
def _validator(schema: str) -> Any:
    """One validator per schema (by its JSON), of the schema's own draft (2020-12 by default)."""
    spec = json.loads(schema)
    cls = jsonschema.validators.validator_for(spec, default=jsonschema.Draft202012Validator)
    return cls(spec, format_checker=cls.FORMAT_CHECKER)


def _short(text: str) -> str:
    return text[:_DETAIL]
