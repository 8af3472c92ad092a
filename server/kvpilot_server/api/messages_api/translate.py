"""A Messages API request as the chat core's `ChatCompletionRequest` (as vLLM's Anthropic
endpoint does): the system prompt a system turn, user turns' tool results `tool` messages,
assistant turns' tool uses `tool_calls`, tools as functions, and the sampling fields under their
chat names. What kvpilot cannot do is refused here, in words; what cannot change the answer
is named in the ignored-fields header."""

import json
from typing import Any

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.fields import Rule, check_extras
from kvpilot_server.api.messages_api.request import (
    Block,
    CountTokensRequest,
    CustomTool,
    MessagesRequest,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from kvpilot_server.api.messages_api.thinking import ThinkingSwitch
from kvpilot_server.api.protocol import ChatCompletionRequest


def _off(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


# field -> (its harmless values, why anything else is refused): fields of Anthropic's API
# that would change the answer and that kvpilot does not implement.
REFUSED_MESSAGES: dict[str, Rule] = {
    "container": (_off, "kvpilot runs no code-execution containers"),
    "mcp_servers": (_off, "kvpilot connects to no MCP servers: send the tools themselves"),
    "context_management": (_off, "kvpilot does not edit the context of a conversation"),
    "output_config": (_off, "output formats and effort levels are not implemented"),
    "diagnostics": (_off, "prompt-cache diagnostics are not implemented"),
    "inference_geo": (_off, "kvpilot runs where it is deployed: no region can be chosen"),
    "speed": (lambda v: v in (None, "standard"), "kvpilot has one speed: standard"),
}
_SERVER_TOOLS = "kvpilot runs no server tools (web search, code execution, bash, computer use, "
_SERVER_TOOLS += "text editor, memory...): define the tool with an input_schema and run it yourself"


def refuse_extras(parsed: CountTokensRequest) -> list[str]:
    """The ignored fields' names, for the header; a refused field set is a 400."""
    ignored = check_extras(parsed, REFUSED_MESSAGES)
    if isinstance(parsed, MessagesRequest) and parsed.metadata is not None:
        ignored.append("metadata")  # accepted as Anthropic's, kept nowhere: named
    return sorted(ignored)


def chat_request(
    parsed: CountTokensRequest, thinking: ThinkingSwitch, stream: bool = False
) -> ChatCompletionRequest:
    """The chat request the core runs (a count_tokens request: without sampling fields)."""
    body: dict[str, Any] = {
        "model": parsed.model,
        "messages": chat_messages(parsed),
        "chat_template_kwargs": thinking.template_kwargs(parsed.thinking) or None,
        **_tool_fields(parsed),
    }
    if isinstance(parsed, MessagesRequest):
        body |= {
            "max_tokens": parsed.max_tokens,
            "stop": parsed.stop_sequences,
            "temperature": parsed.temperature,
            "top_p": parsed.top_p,
            "top_k": parsed.top_k,
            "stream": stream,
        }
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def chat_messages(parsed: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if parsed.system:
        system = parsed.system
        text = system if isinstance(system, str) else "".join(b.text for b in system)
        out.append({"role": "system", "content": text})
    for i, message in enumerate(parsed.messages):
        where = f"messages.{i}.content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
        elif message.role == "user":
            out += _user(message.content, where)
        else:
            out.append(_assistant(message.content, where))
    if parsed.messages[-1].role != "user":
        # Anthropic continues a final assistant turn; kvpilot's chat templates open a new one.
        raise InvalidRequestError(
            "messages: the last message must be the user's: continuing a final assistant "
            "turn (prefill) is not implemented",
            f"messages.{len(parsed.messages) - 1}",
        )
    return out


def _user(blocks: list[Block], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks in order: text runs as user messages, results as tool messages."""
    out: list[dict[str, Any]] = []
    text: list[str] | None = None
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text = (text or []) + [block.text]
        elif isinstance(block, ToolResultBlock):
            if text is not None:
                out.append({"role": "user", "content": "".join(text)})
                text = None
            out.append(_result(block, f"{where}.{j}"))
        else:
            _refuse(block, f"{where}.{j}", "user")
    if text is not None or not out:
        out.append({"role": "user", "content": "".join(text or [])})
    return out


def _result(block: ToolResultBlock, where: str) -> dict[str, Any]:
    content = block.content
    if not isinstance(content, str):
        for k, part in enumerate(content):
            if not isinstance(part, TextBlock):
                _refuse(part, f"{where}.content.{k}", "tool_result")
        content = "".join(part.text for part in content if isinstance(part, TextBlock))
    if block.is_error:  # the chat turn has no such flag: the model reads it in the text
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}


def _assistant(blocks: list[Block], where: str) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            function = {"name": block.name, "arguments": json.dumps(block.input)}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            # Dropped, as reasoning models' chat templates drop past turns' thinking.
            continue
        else:
            _refuse(block, f"{where}.{j}", "assistant")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _refuse(block: Block, where: str, turn: str) -> None:
    kind = block.type
    if isinstance(block, OtherBlock) and kind in ("image", "document"):
        why = f"{kind} blocks are not supported: kvpilot serves text models"
    elif isinstance(block, OtherBlock):
        why = f"content blocks of type {kind!r} are not supported"
    else:
        why = f"a {turn} turn may not hold {kind} blocks"
    raise InvalidRequestError(f"{where}: {why}", where)


def _tool_fields(parsed: CountTokensRequest) -> dict[str, Any]:
    if not parsed.tools:
        if parsed.tool_choice is not None and not isinstance(parsed.tool_choice, ToolChoiceNone):
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        return {}
    functions = []
    for i, tool in enumerate(parsed.tools):
        if not isinstance(tool, CustomTool):
            raise InvalidRequestError(
                f"tools.{i}: tools of type {tool.type!r} are not supported: {_SERVER_TOOLS}",
                f"tools.{i}.type",
            )
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        functions.append({"type": "function", "function": function})
    choice = parsed.tool_choice
    fields: dict[str, Any] = {"tools": functions, "tool_choice": "auto"}
    if isinstance(choice, ToolChoiceNone):
        fields["tool_choice"] = "none"
    elif isinstance(choice, ToolChoiceAny):
        fields["tool_choice"] = "required"
    elif isinstance(choice, ToolChoiceTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if choice is not None and not isinstance(choice, ToolChoiceNone):
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return fields
