"""Tool calling over HTTP on a model whose template has no tool support (the bundled family's,
so the system-turn fallback and the Hermes format): forced calls always name an offered
function with arguments that validate, streams reassemble to the whole answer, and every
malformed tool field is a 400."""

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CLOCK = {
    "type": "object",
    "properties": {"offset": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["offset"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid(calls) -> None:
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert call.id.startswith("call_") and call.type == "function"


def _reassembled(chunks) -> tuple[str | None, list[tuple[str, str]], str | None]:
    content, calls, reason = None, {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            name, arguments = calls.get(call.index, ("", ""))
            function = call.function
            calls[call.index] = (
                name + (function.name or "" if function else ""),
                arguments + (function.arguments or "" if function else ""),
            )
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_always_validate(small_client, parallel):
    out = small_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        n=6,
        temperature=1.0,
        seed=11,
        max_tokens=120,
    )
    for choice in out.choices:
        calls = choice.message.tool_calls
        assert calls and choice.message.content is None
        assert choice.finish_reason in ("tool_calls", "length")
        if choice.finish_reason == "tool_calls":
            _valid(calls)
            assert parallel or len(calls) == 1


def test_named_function_is_the_one_called(small_client):
    out = small_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        n=4,
        temperature=1.0,
        seed=2,
        max_tokens=120,  # room even for a call spelled a character per token
    )
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
        _valid(choice.message.tool_calls)


def test_auto_answers_text_or_a_valid_call(small_client):
    out = small_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, n=8, temperature=1.0, seed=4, max_tokens=40
    )
    for choice in out.choices:
        if choice.message.tool_calls and choice.finish_reason == "tool_calls":
            _valid(choice.message.tool_calls)
        elif choice.finish_reason == "stop":
            assert "<tool_call>" not in (choice.message.content or "")


@pytest.mark.parametrize(
    "tool_choice",
    ["required", "auto", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "auto", "named"],
)
def test_streamed_calls_reassemble_to_the_whole_answer(small_client, tool_choice):
    kwargs = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 80,
    }
    whole = small_client.chat.completions.create(**kwargs).choices[0]
    streamed = _reassembled(small_client.chat.completions.create(**kwargs, stream=True))
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert streamed == (whole.message.content, calls, whole.finish_reason)


def test_a_conversation_with_calls_and_results(small_client):
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    out = small_client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length")


def test_pydantic_function_tools_parse(small_client):
    class GetTime(BaseModel):
        offset: int = Field(ge=-12, le=14)

    out = small_client.chat.completions.parse(
        model="tiny",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetTime)],
        tool_choice="required",
        temperature=0,
        max_tokens=120,
    )
    call = out.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, GetTime)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": TOOLS, "guided_regex": "a"}, "guided_regex"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools.0.function.name",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "a",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{"},
                            }
                        ],
                    }
                ]
            },
            "messages.0.tool_calls.0",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages.0.content",
        ),
    ],
)
def test_malformed_tool_fields_are_400(small_server, body, param):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **body}
    answer = httpx.post(f"{small_server}/v1/chat/completions", json=request, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith(param)
