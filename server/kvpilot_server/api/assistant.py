"""The assistant's side of a chat: how the request's tools reach the model's prompt, and how the
model's text becomes the answer's message (content, reasoning_content, tool_calls), whole or as
stream deltas. Both answers come from the same parser (tools/parser.py), so a streamed answer
reassembles to exactly the non-streamed one."""

import hashlib
from dataclasses import dataclass, field
from typing import Any

from kvpilot_server.api.chat import ToolPlan
from kvpilot_server.api.tools import (
    CallArguments,
    CallStart,
    Content,
    Event,
    Message,
    MessageStream,
    Reasoning,
    ReasoningFormat,
    ToolFormat,
    fold,
)
from kvpilot_server.api.tools.fallback import render_tool_messages, with_tools_prompt
from kvpilot_server.api.tools.formats import (
    FORMATS,
    detect,
    detect_reasoning,
    template_supports_tools,
)


@dataclass(frozen=True)
class ChatTemplate:
    """What the server knows of its model's chat template, read once at start."""

    tool_format: ToolFormat
    native_tools: bool  # the template renders `tools` and tool messages itself
    reasoning: ReasoningFormat | None

    def prompt_messages(
        self, messages: list[dict[str, Any]], plan: ToolPlan | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages to render and the `tools` to hand the template (None: not its job).
        A template without tool support gets the tools in a system turn and past calls and
        results as plain turns, in the syntax the parser then reads back."""
        if self.native_tools:
            return messages, plan.tools if plan else None
        if any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            messages = render_tool_messages(messages, self.tool_format)
        if plan is not None:
            messages = with_tools_prompt(messages, plan.tools, self.tool_format)
        return messages, None


def chat_template(text: str | None, tool_call_parser: str = "auto") -> ChatTemplate:
    """Read a chat template once: its tool-call format (or the one the flag names), whether it
    renders tools itself, and its reasoning tags."""
    fmt = detect(text) if tool_call_parser == "auto" else FORMATS[tool_call_parser]
    return ChatTemplate(fmt, template_supports_tools(text), detect_reasoning(text))


def chat_shape(template: ChatTemplate, plan: ToolPlan | None, prompt_tail: str) -> "ChatShape":
    """How a request's output is read: its tool calls if it offered tools, its reasoning if
    the model reasons; prompt_tail (the prompt's last text) tells if the thinking is open."""
    reasoning = template.reasoning
    opened = False
    if reasoning is not None:
        tail = prompt_tail.rstrip()
        opened = tail.endswith(reasoning.start)
    return ChatShape("", template.tool_format if plan is not None else None, reasoning, opened)


@dataclass
class ChatShape:
    """How one request's output is read: tool calls in `tools`' format (None: no tools may be
    called), reasoning between `reasoning`'s tags (opened: the prompt wrote the start tag)."""

    request_id: str
    tools: ToolFormat | None
    reasoning: ReasoningFormat | None
    opened: bool = False
    _streams: dict[int, MessageStream] = field(default_factory=dict)
    _called: set[int] = field(default_factory=set)

    @property
    def plain(self) -> bool:
        return self.tools is None and self.reasoning is None

    def message(self, choice: int, text: str) -> tuple[dict[str, Any], bool]:
        """The whole answer's message for choice `choice`, and whether it calls tools."""
        if self.plain:
            return {"role": "assistant", "content": text}, False
        parsed = self.parsed(text)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if self.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self.call_id(choice, i),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for i, call in enumerate(parsed.tool_calls)
            ]
        return message, bool(parsed.tool_calls)

    def events(self, choice: int, text: str, finished: bool) -> list[Event]:
        """What a piece of choice `choice`'s text adds (finished: it is the last), neighbouring
        events of one kind merged: every API's stream is made from these."""
        if self.plain:
            return [Content(text)] if text else []
        stream = self._streams.setdefault(choice, self._stream())
        events = stream.feed(text) if text else []
        if finished:
            events += stream.close()
        for event in events:
            if isinstance(event, CallStart):
                self._called.add(choice)
        return _merged(events)

    def parsed(self, text: str) -> Message:
        """A whole output read: content, reasoning and calls (every API's answer is made from
        this, and it is the fold of `events`: streamed and whole answers agree)."""
        if self.plain:
            return Message(text, None)
        stream = self._stream()
        return fold([*stream.feed(text), *stream.close()])

    def deltas(self, choice: int, text: str, finished: bool) -> list[dict[str, Any]]:
        """Chat completion stream deltas of a piece of choice `choice`'s text."""
        return [self._delta(choice, event) for event in self.events(choice, text, finished)]

    def called(self, choice: int) -> bool:
        """Whether the streamed choice has made a tool call so far."""
        return choice in self._called

    def call_id(self, choice: int, index: int) -> str:
        """Deterministic per request, so the same answer streamed or not has the same ids."""
        digest = hashlib.sha256(f"{self.request_id}:{choice}:{index}".encode()).hexdigest()
        return f"call_{digest[:24]}"

    def _stream(self) -> MessageStream:
        return MessageStream(self.tools, self.reasoning, self.opened)

    def _delta(self, choice: int, event: Event) -> dict[str, Any]:
        if isinstance(event, Content):
            return {"content": event.text}
        if isinstance(event, Reasoning):
            return {"reasoning_content": event.text}
        if isinstance(event, CallStart):
            function = {"name": event.name, "arguments": ""}
            call = {"index": event.index, "id": self.call_id(choice, event.index)}
            return {"tool_calls": [{**call, "type": "function", "function": function}]}
        assert isinstance(event, CallArguments)
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


def _merged(events: list[Event]) -> list[Event]:
    """Neighbouring events of one kind as one: fewer chunks, the same reassembled answer."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + event.text)
        elif isinstance(event, Reasoning) and isinstance(last, Reasoning):
            out[-1] = Reasoning(last.text + event.text)
        elif (
            isinstance(event, CallArguments)
            and isinstance(last, CallArguments)
            and last.index == event.index
        ):
            out[-1] = CallArguments(event.index, last.text + event.text)
        else:
            out.append(event)
    return out
