"""Tools for models whose chat template knows nothing of them (formats.template_supports_tools
is False): the request's functions and the call syntax go into a system turn, and past calls
and their results are rewritten as the plain turns such a template can render. The model is
then parsed with the same format it was taught, so the syntax shown here comes from the
ToolFormat itself and cannot drift from what the parser expects. Output is a pure function of
the input (no sorting of what the caller ordered, no randomness): identical requests give
identical prompts, which keeps the prefix cache warm."""

import json
from typing import Any

from kvpilot_server.api.tools.formats import ToolFormat

_EXAMPLE_NAME = "<function name>"
_EXAMPLE_ARGUMENTS = "<arguments as a JSON object>"


def tools_system_prompt(tools: list[dict[str, Any]], fmt: ToolFormat) -> str:
    """A system-turn text listing the functions of OpenAI `tools` entries
    ({"type": "function", "function": {"name", "description", "parameters"}}) and saying
    exactly how to call them in `fmt`'s syntax."""
    lines = ["You can call the following functions. Each is listed with its JSON Schema."]
    for tool in tools:
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(function, dict):
            continue
        lines.append("")
        lines.append(f"Function: {function.get('name', '')}")
        if function.get("description"):
            lines.append(f"Description: {function['description']}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        lines.append(f"Parameters: {json.dumps(parameters, ensure_ascii=False)}")
    one = fmt.section([fmt.body(_EXAMPLE_NAME, _EXAMPLE_ARGUMENTS)])
    two = fmt.section([fmt.body(_EXAMPLE_NAME, _EXAMPLE_ARGUMENTS)] * 2)
    lines += [
        "",
        "To call a function, answer with exactly this, the arguments matching its parameters:",
        one,
        "To call several at once:",
        two,
        "Write nothing after the calls; their results will be given to you. If no function is "
        "needed, answer normally.",
    ]
    return "\n".join(lines)


def with_tools_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], fmt: ToolFormat
) -> list[dict[str, Any]]:
    """The conversation with the tools prompt in its system turn: put before a leading system
    message's text, or as a new first message (many templates accept one system turn only,
    and only first)."""
    prompt = tools_system_prompt(tools, fmt)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{prompt}\n\n{_text(first.get('content'))}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def render_tool_messages(messages: list[dict[str, Any]], fmt: ToolFormat) -> list[dict[str, Any]]:
    """OpenAI messages with tool calls and results as plain system/user/assistant turns, in the
    conversation's order: an assistant's `tool_calls` written after its text in `fmt`'s syntax
    (as the model would have written them), a run of `tool` messages as one user turn of
    "Result of <name> (<id>): <content>" paragraphs, joined with a user message that follows
    it directly (many templates insist that user and assistant turns alternate). Other
    messages pass unchanged."""
    names: dict[str, str] = {}  # tool_call_id -> function name, from the calls seen so far
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for message in messages:
        if message.get("role") == "tool":
            results.append(_result(message, names))
            continue
        if results:
            text = "\n\n".join(results)
            results = []
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                out.append({**message, "content": f"{text}\n\n{message['content']}"})
                continue
            out.append({"role": "user", "content": text})
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            out.append(_assistant(message, calls, fmt, names))
        else:
            out.append(dict(message))
    if results:
        out.append({"role": "user", "content": "\n\n".join(results)})
    return out


def _assistant(
    message: dict[str, Any], calls: list[dict[str, Any]], fmt: ToolFormat, names: dict[str, str]
) -> dict[str, Any]:
    bodies = []
    for call in calls:
        function = call.get("function") or {}
        name = str(function.get("name", ""))
        if call.get("id") is not None:
            names[str(call["id"])] = name
        bodies.append(fmt.body(name, _arguments(function.get("arguments"))))
    text = _text(message.get("content"))
    content = f"{text}\n{fmt.section(bodies)}" if text else fmt.section(bodies)
    rendered = {k: v for k, v in message.items() if k != "tool_calls"}
    rendered["content"] = content
    return rendered


def _result(message: dict[str, Any], names: dict[str, str]) -> str:
    call_id = str(message.get("tool_call_id", ""))
    name = message.get("name") or names.get(call_id, "a function")
    return f"Result of {name} ({call_id}): {_text(message.get('content'))}"


def _arguments(arguments: Any) -> str:
    """OpenAI sends arguments as JSON text; the text is kept as the model wrote it."""
    if isinstance(arguments, str):
        return arguments.strip() or "{}"
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(str(p) for p in parts)
    return str(content)
