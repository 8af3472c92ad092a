"""Tools for templates without tool support: the system prompt that teaches a format, and past
calls and results rewritten as plain turns (golden/fallback_conversation/)."""

import copy
import json
from pathlib import Path

import pytest

from kvpilot_server.api.tools.fallback import (
    render_tool_messages,
    tools_system_prompt,
    with_tools_prompt,
)
from kvpilot_server.api.tools.formats import FORMATS, HERMES
from kvpilot_server.api.tools.parser import parse

CONVERSATION = Path(__file__).parent / "golden" / "fallback_conversation"
FORMAT_LIST = [FORMATS[name] for name in sorted(FORMATS)]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def _messages() -> list[dict]:
    return json.loads((CONVERSATION / "messages.json").read_text(encoding="utf-8"))


def test_a_conversation_with_calls_renders_as_plain_turns():
    expected = json.loads((CONVERSATION / "hermes.json").read_text(encoding="utf-8"))
    assert render_tool_messages(_messages(), HERMES) == expected
    assert {m["role"] for m in expected} == {"system", "user", "assistant"}


@pytest.mark.parametrize("fmt", FORMAT_LIST, ids=lambda f: f.name)
def test_rendered_calls_parse_back_to_the_calls(fmt):
    messages = _messages()
    original = copy.deepcopy(messages)
    rendered = render_tool_messages(messages, fmt)
    assert messages == original  # the caller's messages are not changed
    assert render_tool_messages(messages, fmt) == rendered  # the same prompt every time
    called = [m for m in messages if m.get("tool_calls")]
    turns = [m for m in rendered if m["role"] == "assistant" and m["content"] != _plain(messages)]
    assert len(turns) == len(called)
    for message, turn in zip(called, turns, strict=True):
        parsed = parse(turn["content"], fmt)
        assert parsed.content == message["content"]
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
        ]


def _plain(messages: list[dict]) -> str:
    """The one assistant turn of the fixture without calls."""
    return next(
        m["content"] for m in messages if m["role"] == "assistant" and "tool_calls" not in m
    )


def test_results_name_their_function_and_keep_the_order():
    messages = [
        {"role": "tool", "tool_call_id": "x9", "content": "orphan"},
        {"role": "tool", "tool_call_id": "x10", "name": "legacy", "content": "named"},
        {"role": "assistant", "content": "ok"},
    ]
    assert render_tool_messages(messages, HERMES) == [
        {
            "role": "user",
            "content": "Result of a function (x9): orphan\n\nResult of legacy (x10): named",
        },
        {"role": "assistant", "content": "ok"},
    ]


@pytest.mark.parametrize("fmt", FORMAT_LIST, ids=lambda f: f.name)
def test_the_tools_prompt_lists_each_function_and_the_exact_syntax(fmt):
    prompt = tools_system_prompt([WEATHER, TIME], fmt)
    assert prompt == tools_system_prompt([WEATHER, TIME], fmt)
    assert "Function: get_weather\nDescription: Current weather in a city.\n" in prompt
    assert json.dumps(WEATHER["function"]["parameters"]) in prompt
    assert "Function: get_time\nParameters: " in prompt  # no description, an empty schema
    example = fmt.section([fmt.body("<function name>", "<arguments as a JSON object>")])
    assert f"\n{example}\n" in prompt
    # What the prompt shows, filled in, is what the parser reads.
    filled = example.replace('"<function name>"', '"get_time"')
    filled = filled.replace("<arguments as a JSON object>", "{}")
    assert [(c.name, c.arguments) for c in parse(filled, fmt).tool_calls] == [("get_time", "{}")]


def test_the_tools_prompt_goes_first_in_the_system_turn():
    prompt = tools_system_prompt([WEATHER], HERMES)
    user = {"role": "user", "content": "Hi"}
    assert with_tools_prompt([user], [WEATHER], HERMES) == [
        {"role": "system", "content": prompt},
        user,
    ]
    system = {"role": "system", "content": "Be brief."}
    assert with_tools_prompt([system, user], [WEATHER], HERMES) == [
        {"role": "system", "content": f"{prompt}\n\nBe brief."},
        user,
    ]
