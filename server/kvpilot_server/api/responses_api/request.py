"""A Responses API request (POST /v1/responses) and its translation into the chat request the
shared core serves: `input` items become chat messages, function tools chat tools, `text.format`
the response format, `reasoning` the template's thinking switch. What kvpilot cannot do is
refused in words (hosted tools, images, background runs), never dropped."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.chat import MAX_TOOLS
from kvpilot_server.api.messages_api.request import TextOr
from kvpilot_server.api.protocol import Body, PositiveInt

MAX_ITEMS = 2048  # input items per request (docs/limits.md)
MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys of 64 and values of 512 characters
_KEY, _VALUE = Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]


class _Item(BaseModel):
    """Input items keep unknown keys (clients send back what they received, ids and status
    included); only the keys read here change anything."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class ContentPart(_Item):
    type: str  # input_text, output_text; anything else is refused by `text_of`
    text: str | None = None


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: TextOr[Annotated[list[ContentPart], Field(max_length=MAX_ITEMS)]]


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: TextOr[Annotated[list[ContentPart], Field(max_length=MAX_ITEMS)]]


class ReasoningItem(_Item):
    type: Literal["reasoning"]


class OtherItem(_Item):
    """Any other item type: refused by name in `chat_messages`."""

    type: str


_KNOWN_ITEMS = {"message", "function_call", "function_call_output", "reasoning"}


def _item_kind(data: Any) -> str:
    """An item's model by its `type` (a message's may be left out, as the SDK's easy input
    messages do): a bad item's error is then its own model's, not a union's first mismatch."""
    kind = data.get("type", "message") if isinstance(data, dict) else getattr(data, "type", None)
    return kind if kind in _KNOWN_ITEMS else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class FunctionTool(_Item):
    type: str  # function; a hosted tool's type is refused by `chat_tools`
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Body):
    type: Literal["function"]
    name: str


class TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class TextConfig(Body):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only one kvpilot's models have


def _choice_kind(value: Any) -> str:
    return "mode" if isinstance(value, str) else "function"


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("mode")]
    | Annotated[NamedFunction, Tag("function")],
    Discriminator(_choice_kind),
]


class ReasoningConfig(Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # kvpilot writes no summaries: the reasoning text itself comes back as reasoning_text.
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(Body):
    model: str | None = None
    input: TextOr[Annotated[list[InputItem], Field(max_length=MAX_ITEMS)]]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    metadata: Annotated[dict[_KEY, _VALUE], Field(max_length=MAX_METADATA)] | None = None
    store: bool = True
    previous_response_id: Annotated[str, Field(max_length=128)] | None = None
    stream: bool = False
    service_tier: Literal["auto", "default", "flex"] | None = None
    # auto: the oldest turns dropped to fit the context; disabled: a 400 when it does not fit;
    # absent: the server's --context-overflow decides (ServingResponses).
    truncation: Literal["auto", "disabled"] | None = None
    # Accepted as OpenAI reads them: who the end user is, a cache-routing hint. Neither changes
    # the answer; kvpilot's prefix cache needs no key.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # vLLM's sampling extras, as on chat completions.
    seed: int | None = None
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    ignore_eos: bool | None = None  # outputs run to max_output_tokens (benchmarks)

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat request this one is: `history` (a stored conversation continued) before
        this request's input, the instructions first."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += history + self.conversation()
        if not messages:
            raise InvalidRequestError("input is empty", "input")
        body: dict[str, Any] = {"messages": messages, "stream": self.stream}
        if self.model is not None:
            body["model"] = self.model
        sampling = {
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos,
            "service_tier": self.service_tier,
        }
        body |= {key: value for key, value in sampling.items() if value is not None}
        body |= self._tool_fields() | self._format() | self._thinking()
        return body

    def conversation(self) -> list[dict[str, Any]]:
        """This request's input as chat messages (what a continuation stores)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return chat_messages(self.input)

    def _tool_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"parallel_tool_calls": self.parallel_tool_calls}
        if self.tools:
            fields["tools"] = chat_tools(self.tools)
        choice = self.tool_choice
        if isinstance(choice, NamedFunction):
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif choice is not None:
            fields["tool_choice"] = choice
        return fields

    def _format(self) -> dict[str, Any]:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return {}
        if fmt.type == "json_object":
            return {"response_format": {"type": "json_object"}}
        if fmt.name is None or fmt.schema_ is None:
            raise InvalidRequestError(
                "text.format of type json_schema needs a name and a schema", "text.format"
            )
        schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
        if fmt.description is not None:
            schema["description"] = fmt.description
        return {"response_format": {"type": "json_schema", "json_schema": schema}}

    def _thinking(self) -> dict[str, Any]:
        """reasoning.effort as the chat template's switch (Qwen3's `enable_thinking`): none
        turns thinking off, any other effort on. A template without the switch ignores it."""
        effort = self.reasoning.effort if self.reasoning else None
        if effort is None:
            return {}
        return {"chat_template_kwargs": {"enable_thinking": effort != "none"}}


def text_of(parts: str | list[ContentPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for i, part in enumerate(parts):
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise InvalidRequestError(
                f"{where}.{i}: content of type {part.type!r} is not supported: kvpilot serves "
                "text models, whose parts are input_text (output_text for the assistant)",
                f"{where}.{i}.type",
            )
        texts.append(part.text)
    return "".join(texts)


def chat_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages: function calls join the assistant turn they follow, their
    outputs become tool messages. Reasoning items are read and left out of the prompt, as chat
    templates leave past thinking out."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": text_of(item.content, where)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and _same_turn(items[i - 1]):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            content = text_of(item.output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
        elif not isinstance(item, ReasoningItem):
            raise InvalidRequestError(
                f"{where}: items of type {item.type!r} are not supported: kvpilot reads "
                "message, function_call, function_call_output and reasoning items",
                f"{where}.type",
            )
    return messages


def _same_turn(previous: InputItem) -> bool:
    """A call after the assistant's text, its reasoning or another call is of the same turn."""
    return isinstance(previous, MessageItem | FunctionCallItem | ReasoningItem)


def chat_tools(tools: list[FunctionTool]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.type != "function" or tool.name is None:
            raise InvalidRequestError(
                f"tools.{i}: tools of type {tool.type!r} are not supported: kvpilot runs no "
                "hosted tools (web search, file search, code interpreter, ...); send function "
                "tools and run them in the application",
                f"tools.{i}.type",
            )
        function: dict[str, Any] = {"name": tool.name}
        for key in ("description", "parameters", "strict"):
            if (value := getattr(tool, key)) is not None:
                function[key] = value
        out.append({"type": "function", "function": function})
    return out
