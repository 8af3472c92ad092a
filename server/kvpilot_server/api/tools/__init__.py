"""Tool calls and reasoning in chat completions, without the engine: the call syntax of each
model family (formats), a prompt that teaches it to models whose template cannot (fallback),
and the one parser that splits an output into content, reasoning and calls, streamed or whole
(parser; its pieces: events, matching, calls)."""

from kvpilot_server.api.tools.events import (
    CallArguments,
    CallStart,
    Content,
    Event,
    Message,
    Reasoning,
    ToolCall,
    fold,
)
from kvpilot_server.api.tools.formats import (
    FORMATS,
    THINK,
    ReasoningFormat,
    ToolFormat,
    detect,
    detect_reasoning,
    template_supports_tools,
)
from kvpilot_server.api.tools.parser import MessageStream, parse

__all__ = [
    "FORMATS",
    "THINK",
    "CallArguments",
    "CallStart",
    "Content",
    "Event",
    "Message",
    "MessageStream",
    "Reasoning",
    "ReasoningFormat",
    "ToolCall",
    "ToolFormat",
    "detect",
    "detect_reasoning",
    "fold",
    "parse",
    "template_supports_tools",
]
