"""The call section of a model's output, scanned as it arrives: from the trigger to the end of
the last call. Each call body is `{"name": "<function>", "<arguments key>": {...}}`: the name is
announced once its string is whole, and the arguments object is passed on raw, piece by piece,
up to its matching close brace (strings, escapes and nesting tracked, nothing else validated:
the client parses the arguments, and the text must reach it exactly as the model wrote it).

Forgiving where models are sloppy, strict where text could be misread: whitespace around the
format's literals is free, the arguments key may be "arguments" or "parameters", extra keys
after the arguments are skipped, a body without arguments means `{}`. Text that stops fitting
ends the section: after a complete call it is ordinary output again (DONE, `rest`); inside a
call it is returned verbatim as content from where parsing stopped (FAILED, `rest`), so nothing
is lost and the same text always parses the same way."""

import json
from enum import Enum

from kvpilot_server.api.tools.events import CallArguments, CallStart, Event
from kvpilot_server.api.tools.formats import ToolFormat
from kvpilot_server.api.tools.matching import JsonValue


class Outcome(Enum):
    OPEN = "open"  # still inside the section
    DONE = "done"  # the section ended; `rest` is the output that follows it
    FAILED = "failed"  # the text stopped being a call; `rest` is content, verbatim


# A body after its opening brace: punctuation to expect (after any whitespace), or what the
# step reads. The name's CallStart is sent at NAME's closing quote.
_KEY_NAME, _NAME, _KEY_ARGUMENTS = "key", "name", "arguments key"
_ARGUMENTS, _AFTER, _EXTRA = "arguments", "after", "extra keys"
_BODY: tuple[str, ...] = ('"', _KEY_NAME, ":", '"', _NAME, ",", '"', _KEY_ARGUMENTS, ":", "{")
_BODY += (_ARGUMENTS, _AFTER, _EXTRA)
_STRINGS = (_KEY_NAME, _NAME, _KEY_ARGUMENTS)
_ARGUMENT_KEYS = ("arguments", "parameters")


def _solid(text: str) -> str:
    """A literal without its whitespace, which the scanner matches loosely."""
    return "".join(text.split())


class CallSection:
    """Fed the output from the start of the trigger (whitespace before it included, so that a
    failed section gives back exactly what it was given); calls are numbered from
    `first_index`. Holds what it has not decided yet; closing is simply dropping that: a call
    cut off before its name is whole has nothing to call, and arguments are sent as they come.
    """

    def __init__(self, fmt: ToolFormat, first_index: int) -> None:
        self.outcome = Outcome.OPEN
        self.rest = ""
        self.index = first_index  # the current (or next) call's index
        self._continue = _solid(fmt.separator + fmt.call_begin) + "{"
        self._end = _solid(fmt.end)
        self._call_end = _solid(fmt.call_end)
        self._buf = ""
        self._pos = 0
        self._attempt = 0  # where the current call's text began: given back if it fails unnamed
        self._mark = 0  # where the string being read, or the text after the last call, starts
        self._step = -1  # index in _BODY; -1 while matching literals
        # Literals that may come next, as (text without whitespace, tag); mismatch: how it ends.
        self._literals = [(_solid(fmt.begin + fmt.call_begin) + "{", "body")]
        self._matched = 0
        self._mismatch = Outcome.FAILED
        self._json = JsonValue(0)
        self._escaped = False  # in the string being read, the last character was a backslash

    @property
    def named(self) -> bool:
        """Whether the current call's CallStart was sent."""
        return self._step > _BODY.index(_NAME)

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self.outcome is Outcome.OPEN and self._pos < len(self._buf):
            if self._step < 0:
                self._literal()
            else:
                self._body(events)
        self._trim()
        return events

    def _finish(self, outcome: Outcome, rest_from: int) -> None:
        self.outcome, self.rest = outcome, self._buf[rest_from:]

    def _fail(self) -> None:
        """The text stopped being a call: give back an unnamed call's whole text, or a named
        call's text from here (the call itself was announced and stays)."""
        self._finish(Outcome.FAILED, self._pos if self.named else self._attempt)

    def _skip_space(self) -> bool:
        """Move past whitespace; False when the buffer is used up."""
        while self._pos < len(self._buf) and self._buf[self._pos].isspace():
            self._pos += 1
        return self._pos < len(self._buf)

    def _expect_literals(self, literals: list[tuple[str, str]]) -> None:
        self._step, self._matched, self._mark = -1, 0, self._pos
        self._literals = [(text, tag) for text, tag in literals if text]
        self._mismatch = Outcome.DONE
        if not self._literals:
            self._finish(Outcome.DONE, self._pos)

    def _literal(self) -> None:
        """One non-space character of the literals that may come next."""
        if not self._skip_space():
            return
        c, i = self._buf[self._pos], self._matched
        alive = [(text, tag) for text, tag in self._literals if text[i] == c]
        if not alive:
            self._finish(self._mismatch, self._mark)
            return
        self._pos += 1
        self._matched += 1
        self._literals = alive
        whole = [tag for text, tag in alive if len(text) == self._matched]
        if not whole:
            return
        if whole[0] == "body":
            self._attempt, self._step = self._mark, 0
        elif whole[0] == "call_end":
            self._expect_literals([(self._continue, "body"), (self._end, "end")])
        else:
            self._finish(Outcome.DONE, self._pos)

    def _body(self, events: list[Event]) -> None:
        step = _BODY[self._step]
        if step in _STRINGS:
            self._string(step, events)
        elif step == _ARGUMENTS:
            start = self._pos
            end = self._json.scan(self._buf, start)
            self._pos = len(self._buf) if end < 0 else end
            events.append(CallArguments(self.index, self._buf[start : self._pos]))
            if end >= 0:
                self._step += 1
        elif step == _AFTER:
            self._after_arguments()
        elif step == _EXTRA:
            end = self._json.scan(self._buf, self._pos)
            self._pos = len(self._buf) if end < 0 else end
            if end >= 0:
                self._call_done()
        elif self._skip_space():
            self._punctuation(step, events)

    def _punctuation(self, expected: str, events: list[Event]) -> None:
        c = self._buf[self._pos]
        if c == "}" and expected == ",":
            # `{"name": "f"}`: a function without parameters, called with no arguments.
            self._pos += 1
            events.append(CallArguments(self.index, "{}"))
            self._call_done()
        elif c != expected:
            self._fail()
        elif expected == "{":  # the arguments object opens; it is sent from its brace on
            self._json = JsonValue(0)
            self._step += 1
        else:
            self._pos += 1
            self._step += 1
            self._mark = self._pos - 1  # a string's opening quote, when one comes next

    def _string(self, role: str, events: list[Event]) -> None:
        """Read on to the string's closing quote; then check (keys) or announce (the name)."""
        buf, i = self._buf, self._pos
        escaped = self._escaped
        while i < len(buf):
            c = buf[i]
            i += 1
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                break
        else:
            self._pos, self._escaped = i, escaped  # the string goes on: wait for the rest
            return
        self._pos, self._escaped = i, False
        try:
            value = json.loads(buf[self._mark : i], strict=False)
        except ValueError:
            self._fail()
            return
        if role == _KEY_NAME and value != "name":
            self._fail()
        elif role == _KEY_ARGUMENTS and value not in _ARGUMENT_KEYS:
            self._pos = self._mark
            self._fail()
        else:
            if role == _NAME:
                events.append(CallStart(self.index, value))
            self._step += 1

    def _after_arguments(self) -> None:
        """Past the arguments: the body's close brace, other keys up to it, or (forgiven) no
        brace at all."""
        if not self._skip_space():
            return
        c = self._buf[self._pos]
        if c == ",":  # more keys: skipped, whatever they hold, up to the body's close brace
            self._pos += 1
            self._json = JsonValue(1)
            self._step += 1
            return
        if c == "}":
            self._pos += 1
        self._call_done()

    def _call_done(self) -> None:
        self.index += 1
        if self._call_end:
            self._expect_literals([(self._call_end, "call_end")])
        else:
            self._expect_literals([(self._continue, "body"), (self._end, "end")])

    def _trim(self) -> None:
        """Forget what can no longer be given back, so that the buffer stays small."""
        if self.outcome is not Outcome.OPEN:
            return
        if self._step < 0:
            keep = self._mark
        elif not self.named:
            keep = self._attempt
        elif _BODY[self._step] in _STRINGS:
            keep = self._mark
        else:
            keep = self._pos
        self._buf = self._buf[keep:]
        self._pos -= keep
        self._mark = max(0, self._mark - keep)
        self._attempt = max(0, self._attempt - keep)
