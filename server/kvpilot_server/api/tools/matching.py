"""Scanning text that arrives in pieces. Finding a marker (a tool-call trigger, the reasoning end
tag): a stream must hold back any tail that could still grow into the marker, so that no
fragment of it is ever emitted as content, and Marker.find says where that tail starts. Finding
where a JSON value ends (JsonValue), to pass a call's arguments on before they are whole."""

import re
from dataclasses import dataclass

# Whitespace as str.isspace sees it, skipped at C speed: a model stuck emitting blanks after a
# brace would otherwise cost a Python loop over all of them on every token.
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class Found:
    """Where the first marker, or the start of a possible one, lies in a text."""

    at: int  # index of the (possible) marker; len(text) when there is none
    complete: bool  # True: a whole marker starts at `at`; False: text[at:] may become one
    end: int  # index just after a complete marker (== at otherwise)


@dataclass(frozen=True)
class Marker:
    """Literal pieces that must appear in order, any whitespace allowed between two pieces (not
    inside one): ("<tool_call>",) is exact, ("{", '"name"') also matches '{ "name"'."""

    pieces: tuple[str, ...]

    def find(self, text: str) -> Found:
        """The first position where a whole marker starts, or where text's tail is the beginning
        of one; whichever comes first. Scanning left to right means the earliest candidate
        wins, so text before it is never a marker's start."""
        first = self.pieces[0][0]
        at = text.find(first)
        while at != -1:
            end = self._match(text, at)
            if end is not None:
                return Found(at, end > 0, max(end, at))
            at = text.find(first, at + 1)
        return Found(len(text), False, len(text))

    def _match(self, text: str, at: int) -> int | None:
        """The marker's end if it is whole at `at`, -1 if text ends inside it, None if it is not
        there."""
        i = at
        for k, piece in enumerate(self.pieces):
            if k:
                space = _SPACE.match(text, i)
                i = space.end() if space else i
            seen = text[i : i + len(piece)]
            if len(seen) < len(piece):
                return -1 if piece.startswith(seen) else None
            if seen != piece:
                return None
            i += len(piece)
        return i


@dataclass
class JsonValue:
    """Enough of a JSON value's syntax to find where it closes: nesting depth and strings with
    their escapes, carried from one piece of text to the next."""

    depth: int
    in_string: bool = False
    escaped: bool = False

    def scan(self, text: str, i: int) -> int:
        """Index just after the value's closing bracket, or -1 if `text` ends first."""
        for j in range(i, len(text)):
            c = text[j]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return j + 1
        return -1
