"""One parser for a chat completion's output, streamed or whole: reasoning, content and tool
calls as events (events.py). `parse` is the fold of one stream fed the whole text, so a
streamed answer and a non-streamed one cannot disagree.

The output is read as: optional reasoning at the very start (between the reasoning tags, the
opening one possibly already in the prompt), then content, in which the format's trigger opens
a call section (calls.py); what follows a complete section is content again. Text that might
still become a trigger or the reasoning end tag is held back until decided, and so is trailing
whitespace, so that neither a fragment of a marker nor the blank line before one reaches the
client. Every input is some output: no text makes feed or close raise."""

from enum import Enum

from kvpilot_server.api.tools.calls import CallSection, Outcome
from kvpilot_server.api.tools.events import (
    Content,
    Event,
    Message,
    Reasoning,
    fold,
)
from kvpilot_server.api.tools.formats import BARE_JSON_TRIGGER, ReasoningFormat, ToolFormat
from kvpilot_server.api.tools.matching import Marker

__all__ = ["MessageStream", "parse"]


class _Mode(Enum):
    START = "start"  # reasoning is on and the output may yet open with its start tag
    REASONING = "reasoning"
    CONTENT = "content"
    CALLS = "calls"  # inside a call section
    VERBATIM = "verbatim"  # a call section failed: the rest is content as written
    CLOSED = "closed"


def _trigger(fmt: ToolFormat) -> Marker:
    """The trigger as a marker; a bare-JSON body's opening may have whitespace after its brace."""
    if fmt.trigger == BARE_JSON_TRIGGER:
        return Marker(("{", BARE_JSON_TRIGGER[1:]))
    return Marker((fmt.trigger,))


class MessageStream:
    """Splits a model's output as it arrives. fmt None: no tool calls are parsed. reasoning
    None: there is no reasoning. starts_in_reasoning: the prompt already opened the reasoning,
    so the output starts inside it (a start tag the model repeats anyway is dropped)."""

    def __init__(
        self,
        fmt: ToolFormat | None,
        reasoning: ReasoningFormat | None = None,
        starts_in_reasoning: bool = False,
    ) -> None:
        self._fmt = fmt
        self._reasoning = reasoning
        self._starts_in_reasoning = starts_in_reasoning
        self._trigger = _trigger(fmt) if fmt is not None else None
        self._end_tag = Marker((reasoning.end,)) if reasoning is not None else None
        self._mode = _Mode.START if reasoning is not None else _Mode.CONTENT
        self._pending = ""  # text received but not yet emitted, undecided
        self._skip_space = False  # drop whitespace before the next text of the current mode
        self._section: CallSection | None = None
        self._next_index = 0

    def feed(self, delta: str) -> list[Event]:
        """The events that `delta` (the next piece of output) decides."""
        events: list[Event] = []
        text: str | None = delta
        while text is not None:
            text = self._step(text, events)
        return events

    def close(self) -> list[Event]:
        """The output ended: flush what was held back. Later feeds are ignored."""
        events: list[Event] = []
        if self._mode is _Mode.START:
            # Never decided (blank, or a cut-off start tag): read on as if it were not a tag.
            events += self.feed(self._enter_after_start())
        pending, self._pending = self._pending, ""
        if self._mode is _Mode.REASONING and pending.strip():
            events.append(Reasoning(pending.rstrip()))
        elif self._mode is _Mode.CONTENT and pending:
            events.append(Content(pending))
        # In a call section only undecided syntax is held: a call cut off before its name is
        # whole has nothing to call, and arguments were sent as they came.
        self._mode = _Mode.CLOSED
        return events

    def _step(self, text: str, events: list[Event]) -> str | None:
        """Handle `text` in the current mode; the text left for the next mode if it changed."""
        if self._mode is _Mode.START:
            return self._start(text, events)
        if self._mode is _Mode.REASONING:
            return self._reasoning_text(text, events)
        if self._mode is _Mode.CONTENT:
            return self._content(text, events)
        if self._mode is _Mode.CALLS:
            return self._calls(text, events)
        if self._mode is _Mode.VERBATIM and text:
            events.append(Content(text))
        return None

    def _start(self, text: str, events: list[Event]) -> str | None:
        assert self._reasoning is not None
        self._pending += text
        tag, head = self._reasoning.start, self._pending.lstrip()
        if len(head) < len(tag) and tag.startswith(head):
            return None  # blank so far, or the start tag's beginning
        if head.startswith(tag):
            self._pending = ""
            self._mode, self._skip_space = _Mode.REASONING, True
            return head[len(tag) :]
        return self._enter_after_start()

    def _enter_after_start(self) -> str:
        """No start tag: the text is reasoning if the prompt opened it, content otherwise."""
        pending, self._pending = self._pending, ""
        if self._starts_in_reasoning:
            self._mode, self._skip_space = _Mode.REASONING, True
        else:
            self._mode = _Mode.CONTENT
        return pending

    def _held(self, text: str) -> str | None:
        """Pending text plus `text`, less the whitespace to skip; None if nothing is left."""
        pending, self._pending = self._pending + text, ""
        if self._skip_space:
            pending = pending.lstrip()
            if not pending:
                return None
            self._skip_space = False
        return pending

    def _reasoning_text(self, text: str, events: list[Event]) -> str | None:
        assert self._end_tag is not None
        pending = self._held(text)
        if pending is None:
            return None
        found = self._end_tag.find(pending)
        head = pending[: found.at].rstrip()
        if head:
            events.append(Reasoning(head))
        if found.complete:
            self._mode, self._skip_space = _Mode.CONTENT, True
            return pending[found.end :]
        self._pending = pending[len(head) :]
        return None

    def _content(self, text: str, events: list[Event]) -> str | None:
        pending = self._held(text)
        if pending is None:
            return None
        if self._trigger is None:
            found_at, complete = len(pending), False
        else:
            found = self._trigger.find(pending)
            found_at, complete = found.at, found.complete
        head = pending[:found_at].rstrip()
        if head:
            events.append(Content(head))
        if complete and self._fmt is not None:
            # The section gets the whitespace before the trigger: it gives it back if it fails.
            self._section = CallSection(self._fmt, self._next_index)
            self._mode = _Mode.CALLS
            return pending[len(head) :]
        self._pending = pending[len(head) :]
        return None

    def _calls(self, text: str, events: list[Event]) -> str | None:
        assert self._section is not None
        section = self._section
        events.extend(section.feed(text))
        if section.outcome is Outcome.OPEN:
            return None
        self._next_index, self._section = section.index, None
        if section.outcome is Outcome.DONE:
            self._mode, self._skip_space = _Mode.CONTENT, True
        else:
            self._mode = _Mode.VERBATIM
        return section.rest


def parse(
    text: str,
    fmt: ToolFormat | None,
    reasoning: ReasoningFormat | None = None,
    starts_in_reasoning: bool = False,
) -> Message:
    """The whole output as one message: the fold of a stream fed all of it, then closed."""
    stream = MessageStream(fmt, reasoning, starts_in_reasoning)
    return fold([*stream.feed(text), *stream.close()])
