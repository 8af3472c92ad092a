"""What a model's output is made of, as a stream of events and as a whole message. The whole
message is defined as the fold of the events, so a streamed answer and a non-streamed one can
only differ if the stream's events differ."""

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Content:
    """Text for the user (the message's `content`)."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """Text of the model's reasoning (`reasoning_content`)."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call begins: its name is complete. Indexes count the output's calls from 0."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next piece of call `index`'s arguments, raw JSON text as the model wrote it."""

    index: int
    text: str


Event = Content | Reasoning | CallStart | CallArguments


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the arguments object's JSON text


@dataclass(frozen=True)
class Message:
    """The parsed output: None where there was no such text."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def fold(events: Iterable[Event]) -> Message:
    """The message a sequence of events adds up to: texts joined in order, each call's argument
    pieces joined, calls ordered by index. Argument pieces of a call that never started (which
    MessageStream does not produce) are ignored."""
    content: list[str] = []
    reasoning: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, Content):
            content.append(event.text)
        elif isinstance(event, Reasoning):
            reasoning.append(event.text)
        elif isinstance(event, CallStart):
            names[event.index] = event.name
            arguments.setdefault(event.index, [])
        elif event.index in arguments:
            arguments[event.index].append(event.text)
    calls = [ToolCall(names[i], "".join(arguments[i])) for i in sorted(names)]
    return Message("".join(content) or None, "".join(reasoning) or None, calls)
