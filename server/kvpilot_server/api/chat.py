"""Chat requests beyond plain text turns: OpenAI's message shapes (content parts, assistant
tool calls, tool results, the developer role) and the tool fields (tools, tool_choice,
parallel_tool_calls), checked once and turned into what the chat template and the grammar need.
"""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvpilot_common.errors import InvalidRequestError

MAX_TOOLS = 128  # OpenAI's limit too
_NAME = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class TextPart(_Part):
    type: Literal["text"]  # kvpilot's models read text only: an image part is a 400
    text: str


class FunctionCall(_Part):
    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class AssistantToolCall(_Part):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Part):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def template_message(self, where: str) -> dict[str, Any]:
        """The message as chat templates read it (transformers' convention: tool call
        arguments as objects, the developer role as system)."""
        role = "system" if self.role == "developer" else self.role
        if self.content is None and not (role == "assistant" and self.tool_calls):
            raise InvalidRequestError(f"{where}.content is required for role {role}", where)
        message: dict[str, Any] = {"role": role, "content": self.text}
        if self.name is not None:
            message["name"] = self.name
        if role == "tool":
            if self.tool_call_id is None:
                raise InvalidRequestError(f"{where}.tool_call_id is required for role tool", where)
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            if role != "assistant":
                raise InvalidRequestError(
                    f"{where}: only assistant messages have tool_calls", where
                )
            message["tool_calls"] = [
                _call(c, f"{where}.tool_calls.{i}") for i, c in enumerate(self.tool_calls)
            ]
        return message


def _call(call: AssistantToolCall, where: str) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        raise InvalidRequestError(f"{where}.function.arguments is not JSON", where) from None
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}


class FunctionDef(_Part):
    name: _NAME
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Enforced whatever its value: a forced call's arguments always match the schema.
    strict: bool | None = None


class ToolDef(_Part):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Part):
    name: str


class NamedToolChoice(_Part):
    type: Literal["function"]
    function: NamedFunction


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tool fields ask for: the functions the model is told of, whether a call
    is forced (required, or named: then `offered` holds that one), and how many calls."""

    functions: list[dict[str, Any]]  # every tool, for the prompt
    offered: list[dict[str, Any]]  # those a call may name
    forced: bool
    parallel: bool

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": f} for f in self.functions]


# Variables a request may not set in the template: the ones the server itself passes.
_RESERVED = {"messages", "tools", "add_generation_prompt", "tokenize", "return_dict", "documents"}


class ToolFields(BaseModel):
    """Mixed into the chat request (protocol.py)."""

    # vLLM's extra: variables for the chat template, e.g. {"enable_thinking": false} (Qwen3).
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        kwargs = self.chat_template_kwargs or {}
        bad = [k for k in kwargs if not k.isidentifier() or k in _RESERVED]
        if bad:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(map(repr, bad))}",
                "chat_template_kwargs",
            )
        return kwargs

    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    def tool_plan(self) -> ToolPlan | None:
        """None: no tool may be called (no tools, or tool_choice none)."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none"):
                raise InvalidRequestError("tool_choice needs tools", "tool_choice")
            return None
        if choice == "none":
            return None
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools]
        names = [f["name"] for f in functions]
        if len(set(names)) != len(names):
            raise InvalidRequestError("tools: function names must be unique", "tools")
        offered = functions
        if isinstance(choice, NamedToolChoice):
            offered = [f for f in functions if f["name"] == choice.function.name]
            if not offered:
                raise InvalidRequestError(
                    f"tool_choice names {choice.function.name!r}, which is not among the tools",
                    "tool_choice",
                )
        forced = choice == "required" or isinstance(choice, NamedToolChoice)
        parallel = self.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
        return ToolPlan(functions, offered, forced, parallel)
