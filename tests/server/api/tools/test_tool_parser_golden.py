"""Real outputs of each model family (golden/NAME.txt, exactly as the model wrote them) against
the message they must parse to (golden/NAME.json), whole and streamed."""

import json
from pathlib import Path

import pytest

from kvpilot_server.api.tools.events import Message, fold
from kvpilot_server.api.tools.formats import FORMATS, THINK
from kvpilot_server.api.tools.parser import MessageStream, parse

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(path.stem for path in GOLDEN.glob("*.txt"))


def _case(name: str) -> tuple[str, dict, MessageStream]:
    text = (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
    expected = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    thinking = expected["thinking"]  # None, "tagged" (the output opens it) or "prompt"
    stream = MessageStream(
        FORMATS[expected["format"]], THINK if thinking else None, thinking == "prompt"
    )
    return text, expected, stream


def _whole(name: str) -> Message:
    text, _, stream = _case(name)
    return fold([*stream.feed(text), *stream.close()])


def test_every_format_has_golden_cases():
    formats = {json.loads((GOLDEN / f"{n}.json").read_text())["format"] for n in CASES}
    assert formats == set(FORMATS)
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_a_golden_output_parses_to_its_message(name):
    text, expected, _ = _case(name)
    message = _whole(name)
    assert message.content == expected["content"]
    assert message.reasoning == expected["reasoning"]
    assert [c.name for c in message.tool_calls] == [c["name"] for c in expected["tool_calls"]]
    for call, want in zip(message.tool_calls, expected["tool_calls"], strict=True):
        assert json.loads(call.arguments) == want["arguments"]
        assert call.arguments in text  # the client gets the arguments as the model wrote them


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_a_golden_output_streamed_in_pieces_folds_to_the_same_message(name, size):
    text, _, stream = _case(name)
    events = []
    for at in range(0, len(text), size):
        events += stream.feed(text[at : at + size])
    events += stream.close()
    assert fold(events) == _whole(name)


def test_parse_is_the_fold_of_one_stream():
    text, _, _ = _case("hermes_thinking_before_call")
    assert parse(text, FORMATS["hermes"], THINK) == _whole("hermes_thinking_before_call")
