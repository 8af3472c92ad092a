"""Tool calls as a grammar, built from the format (formats.py) and the tools' parameter
schemas, so that a call the model makes always names an offered function with arguments that
validate against its schema.

- required / a named function: the output is the call section and nothing else;
- auto: free text that cannot contain the format's trigger, or free text up to the trigger and
  then a constrained section (the model decides whether to call; once it starts, the rest of the
  call is enforced). Formats whose calls open with bare JSON have no trigger to wait for, so with
  auto they are parsed, not constrained.
parallel_tool_calls false allows one call. With a JSON response format beside the tools (OpenAI
and vLLM accept both), auto has no free text: the output is an answer in that format or the call
section; a forced call is the whole output, so there is no answer for the format to shape.
JSON is written as the engine's JSON schemas are (", " and ": "), the function name first, as
every format's body has it. Arguments hold the keys their schema names and no others, unless it
says otherwise (json_schemas.closed), and their `$defs` are found where they now sit.
"""

import json
import re
from typing import Any

from kvpilot_server.api.json_schemas import Schema, closed, rebased, styled
from kvpilot_server.api.tools.formats import BARE_JSON_TRIGGER, ToolFormat

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


def tools_grammar(
    fmt: ToolFormat,
    functions: list[dict[str, Any]],
    forced: bool,
    parallel: bool,
    answer: Schema | None = None,
) -> str | None:
    """A Lark grammar for calls of `functions` (OpenAI function objects: name, parameters);
    forced: a call must be made (required, or one named function: pass only that one); answer:
    the JSON schema an answer that calls nothing must follow. None when the format cannot be
    constrained this way (auto with bare-JSON calls and no answer format)."""
    bodies = " | ".join(f"body_{i}" for i in range(len(functions)))
    rules = [f"call: {_literal(fmt.call_begin)} ({bodies}) {_literal(fmt.call_end)}"]
    for i, function in enumerate(functions):
        rules.append(f"body_{i}: %json {json.dumps(_body_schema(fmt, function))}")
    more = f" ({_literal(fmt.separator)} call)*" if parallel else ""
    section = f"{_literal(fmt.begin)} call{more} {_literal(fmt.end)}"
    if forced:
        return "\n".join([f"start: {section}", *rules])
    if answer is not None:
        # No free text: the answer in its format, or the call section from the first character.
        return "\n".join([f"start: formatted | {section}", _answer_rule(answer), *rules])
    opening = fmt.begin + fmt.call_begin
    if fmt.trigger == BARE_JSON_TRIGGER or not opening.startswith(fmt.trigger):
        return None
    # The first call's opening after the trigger, then its body; the trigger itself ends TEXT.
    first = f"{_literal(opening[len(fmt.trigger) :])} ({bodies}) {_literal(fmt.call_end)}"
    trigger = _regex(fmt.trigger)
    return "\n".join(
        [
            f"start: TEXT | CALLING {first}{more} {_literal(fmt.end)}",
            f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{trigger}(.|\\n)*/",
            f"CALLING: /(.|\\n)*{trigger}/ & ~/(.|\\n)*{trigger}(.|\\n)+/",
            *rules,
        ]
    )


def _answer_rule(schema: Schema) -> str:
    # The engine's JSON style as a default, as for a response format alone: whitespace the
    # request itself asked for (vLLM's whitespace_pattern) is already in the schema.
    style = {**_JSON_STYLE, **schema.get("x-guidance", {})}
    return f"formatted: %json {json.dumps(styled(schema, style))}"


def _body_schema(fmt: ToolFormat, function: dict[str, Any]) -> dict[str, Any]:
    # No parameters is OpenAI's "takes no arguments": an empty object, not any object.
    parameters = function.get("parameters") or _NO_ARGUMENTS
    key = fmt.arguments_key
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            key: closed(rebased(parameters, f"/properties/{key}")),
        },
        "required": ["name", key],
        "additionalProperties": False,
        "x-guidance": _JSON_STYLE,
    }


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _regex(text: str) -> str:
    """text as a literal inside a Lark /regex/."""
    return re.escape(text).replace("/", "\\/")
