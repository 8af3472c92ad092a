"""The parser's promises over generated outputs: streaming in any pieces folds to exactly what
parsing the whole text gives; the arguments of complete calls are the JSON text that was
generated, byte for byte; no piece of the call syntax leaks into content; and no text at all,
in any format, makes it raise."""

import json
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpilot_server.api.tools.events import CallArguments, CallStart, Event, Message, fold
from kvpilot_server.api.tools.formats import FORMATS, THINK, ToolFormat
from kvpilot_server.api.tools.parser import MessageStream, parse

FORMAT_LIST = [FORMATS[name] for name in sorted(FORMATS)]
EXAMPLES = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Strings inside arguments: whatever may confuse a scanner that tracks strings and nesting.
MARKERS = [
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS][",
    "</think>",
    '{"name": "x", "arguments": {',
]
TRICKY = st.sampled_from([*'{}[]",:\n\\', '\\"', "é", "日本", "😀", "\u2028", *MARKERS])
STRINGS = st.lists(TRICKY | st.text(max_size=6), max_size=5).map("".join)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3)
)
ARGUMENTS = st.dictionaries(STRINGS, VALUES, max_size=4)
DUMPS = st.sampled_from(
    [{}, {"ensure_ascii": False}, {"indent": 2}, {"separators": (",", ":"), "ensure_ascii": False}]
)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)
# Content and reasoning: anything but the characters that open a format's syntax, so that any
# of them in a Content or Reasoning event is syntax leaking out.
SYNTAX = "<[{"
PROSE = st.text(st.characters(exclude_characters=SYNTAX, exclude_categories=("Cs",)), max_size=30)


@st.composite
def outputs(draw: st.DrawFn, fmt: ToolFormat) -> tuple[str, dict]:
    """An output in `fmt` and what it must parse to."""
    thinking = draw(st.sampled_from([None, "tagged", "prompt"]))
    reasoning, before = draw(PROSE), draw(PROSE)
    calls = draw(st.lists(st.tuples(NAMES, ARGUMENTS, DUMPS), max_size=3))
    after = draw(st.sampled_from(["", "\n", " \n\n"]) | PROSE) if calls else ""
    texts = [json.dumps(arguments, **dump) for _, arguments, dump in calls]
    text = {None: "", "tagged": draw(st.sampled_from(["", "\n"])) + "<think>", "prompt": ""}[
        thinking
    ]
    text += f"{reasoning}</think>" if thinking else ""
    bodies = [fmt.body(name, t) for (name, _, _), t in zip(calls, texts, strict=True)]
    text += before + (fmt.section(bodies) if calls else "") + after
    content = before.lstrip() if thinking else before
    if calls:
        content = content.rstrip() + after.lstrip()
    expected = {
        "thinking": thinking,
        "reasoning_on": thinking is not None or draw(st.booleans()),
        "content": content or None,
        "reasoning": (reasoning.strip() or None) if thinking else None,
        "calls": [(name, t) for (name, _, _), t in zip(calls, texts, strict=True)],
        "arguments": [arguments for _, arguments, _ in calls],
    }
    return text, expected


def _stream(text: str, cuts: list[int], stream: MessageStream) -> list[Event]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    events = [e for a, b in pairwise(bounds) for e in stream.feed(text[a:b])]
    return events + stream.close()


def _text(event: Event) -> str:
    return event.name if isinstance(event, CallStart) else event.text


@EXAMPLES
@given(fmt=st.sampled_from(FORMAT_LIST), data=st.data())
def test_generated_outputs_parse_to_what_was_generated_in_any_pieces(fmt, data):
    text, expected = data.draw(outputs(fmt))
    reasoning = THINK if expected["reasoning_on"] else None
    opened = expected["thinking"] == "prompt"
    message = parse(text, fmt, reasoning, opened)

    assert message.content == expected["content"]
    assert message.reasoning == expected["reasoning"]
    assert [(c.name, c.arguments) for c in message.tool_calls] == expected["calls"]
    assert [json.loads(c.arguments) for c in message.tool_calls] == expected["arguments"]

    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    events = _stream(text, cuts, MessageStream(fmt, reasoning, opened))
    assert fold(events) == message
    for event in events:
        assert _text(event) != "" or isinstance(event, CallStart)
        if not isinstance(event, CallStart | CallArguments):
            assert not set(event.text) & set(SYNTAX), event  # no syntax outside calls


# Arbitrary text, and text made of the formats' pieces in any order (more likely to reach the
# scanner's corners than uniform text).
TAGS = ["<tool_call>", "</tool_call>", "<tool_", "[TOOL_CALLS]", "[TOOL_CALLS][", "<think>", "</th"]
TAGS += ["<", "<thi", "[TOOL_"]
BODIES = ['{"name": "f"', '{"name": ', '"arguments": ', '"parameters": ', '"f"', "{}", '{"a": "}"}']
PIECES = st.sampled_from([*TAGS, "</think>", *BODIES, *'[]{}"\\:,;\n ', "; ", ", "])
NOISE = st.text() | st.lists(PIECES | st.text(max_size=4), max_size=16).map("".join)


@EXAMPLES
@given(
    text=NOISE,
    fmt=st.sampled_from([None, *FORMAT_LIST]),
    reasoning=st.booleans(),
    opened=st.booleans(),
    data=st.data(),
)
def test_any_text_parses_without_error_and_the_same_in_any_pieces(
    text, fmt, reasoning, opened, data
):
    message = parse(text, fmt, THINK if reasoning else None, opened)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    events = _stream(text, cuts, MessageStream(fmt, THINK if reasoning else None, opened))
    assert fold(events) == message
    assert all(_text(e) for e in events if not isinstance(e, CallStart))
    if fmt is None and not opened and not text.lstrip().startswith(THINK.start):
        assert message == Message(text or None, None, [])  # nothing to parse: nothing lost
