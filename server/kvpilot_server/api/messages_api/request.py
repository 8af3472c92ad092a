"""Request bodies of Anthropic's Messages API, strict as the chat API's (protocol.Body: no type
coercion, nulls as absent, unknown top-level fields kept for fields.check_extras). Content
blocks and tools are told apart by their `type`: the kinds kvpilot cannot serve (images,
documents, server tools) parse into catch-all models so that translate.py refuses them in
words rather than with a union's list of mismatches."""

from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Discriminator, Field, Tag

from kvpilot_server.api.chat import MAX_TOOLS
from kvpilot_server.api.protocol import MAX_STOP_LENGTH, MAX_STOP_STRINGS, Body

# A body's size is bounded already (4 MiB); these bound the work per item a list makes.
MAX_BLOCKS = 1024  # content blocks in one message, and in one tool result
MAX_SYSTEM_BLOCKS = 64


class _Strict(Body):
    """Nested objects: a key Anthropic's API does not define there is a 400 naming it (only
    the body's top level may carry ignored fields, which the answer names)."""

    model_config = ConfigDict(extra="forbid")


def _str_or_list(value: Any) -> str:
    return "str" if isinstance(value, str) else "list"


L = TypeVar("L")
# A string or a list of blocks, told apart by the JSON type: a bad block's error is the
# block's, not the string branch's "Input should be a valid string".
TextOr = Annotated[
    Annotated[str, Tag("str")] | Annotated[L, Tag("list")], Discriminator(_str_or_list)
]


class CacheControl(_Strict):
    # Accepted: kvpilot's prefix cache keeps every prompt's blocks without being asked.
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    # Citations are for document blocks, which kvpilot refuses; only their absence is valid.
    citations: Annotated[list[Any], Field(max_length=0)] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=256)]
    content: TextOr[Annotated[list["Block"], Field(max_length=MAX_BLOCKS)]] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


class OtherBlock(Body):
    """Any other block type (image, document, search_result, server tool blocks...): kept to
    be refused by name."""

    type: Annotated[str, Field(max_length=64)]


_KNOWN_BLOCKS = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking"}


def _block_kind(data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return kind if kind in _KNOWN_BLOCKS else "other"


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]
ToolResultBlock.model_rebuild()


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: TextOr[Annotated[list[Block], Field(max_length=MAX_BLOCKS)]]


class CustomTool(_Strict):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    # Enforced whatever its value: a call's input always matches its schema in kvpilot.
    strict: bool | None = None
    # A hint to stream a call's input as it is made, which kvpilot always does.
    eager_input_streaming: bool | None = None


class ServerTool(Body):
    """A tool that Anthropic's servers run (web search, code execution, bash, computer use,
    text editor, memory...): kept to be refused by name."""

    type: Annotated[str, Field(max_length=64)]


def _tool_kind(data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return "custom" if kind in (None, "custom") else "server"


Tool = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[ServerTool, Tag("server")],
    Discriminator(_tool_kind),
]


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1)]
    display: Literal["summarized"] | None = None  # "omitted" would hide it: not implemented


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized"] | None = None


Thinking = Annotated[
    ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")
]


class Metadata(_Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None  # kept nowhere


StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]


class CountTokensRequest(Body):
    """/v1/messages/count_tokens: what makes the prompt."""

    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: TextOr[Annotated[list[TextBlock], Field(max_length=MAX_SYSTEM_BLOCKS)]] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest):
    """/v1/messages: the prompt's fields and how to sample the answer."""

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOP_STRINGS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
