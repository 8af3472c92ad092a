"""Requests as the client libraries applications use send them, against a real server: tool
parameters with `$defs` and `definitions` (a nested Pydantic model, an Enum, a list of models:
instructor's TOOLS mode, pydantic-ai's tool output, `openai.pydantic_function_tool`), tools
beside a response format (openai-agents with an output_type), nulls for fields left unset, and
vLLM's structured-output switches (outlines' vLLM backend). Arguments hold the keys their
schema names and no others."""

import enum
import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoTokenizer

from kvpilot_server.api.json_schemas import each_schema
from kvpilot_server.api.tools.formats import FORMATS
from kvpilot_server.api.tools.grammar import tools_grammar
from kvpilot_server.engine.structured.grammar import GrammarCompiler
from kvpilot_server.sampling_params import StructuredOutputsParams


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Closed(BaseModel):
    """Extra keys are a validation error: the check that arguments hold only named keys."""

    model_config = ConfigDict(extra="forbid")


class Place(Closed):
    city: str = Field(max_length=12)
    unit: Unit


class Forecast(Closed):
    places: list[Place] = Field(max_length=2)  # a list of nested models: $defs and $ref


class Answer(Closed):
    verdict: bool
    reason: str = Field(max_length=20)


def _open(schema: dict) -> dict:
    """A model's schema as most frameworks send it: nothing said of extra keys (the models
    here forbid them only to check what comes back)."""
    return each_schema(schema, lambda s: {k: s[k] for k in s if k != "additionalProperties"})


FORECAST = _open(Forecast.model_json_schema())
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# The same nesting in draft-07's spelling, as older generators write it.
DEFINITIONS = json.loads(
    json.dumps(FORECAST).replace('"$defs"', '"definitions"').replace("#/$defs/", "#/definitions/")
)


def _pydantic_tool() -> dict:
    # What the openai SDK sends: its strict schema (every object closed by it already).
    return openai.pydantic_function_tool(Forecast, name="forecast")


def _plain_tool(parameters: dict) -> dict:
    # As most frameworks send a Pydantic model: its JSON schema, nothing said of extra keys.
    return {"type": "function", "function": {"name": "forecast", "parameters": parameters}}


CHOICES = {
    "required": "required",
    "named": {"type": "function", "function": {"name": "forecast"}},
    "auto": "auto",
}


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer) -> GrammarCompiler:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer)
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_call_grammar_takes_named_keys_only_and_finds_its_defs(compiler, fmt):
    """What the model could write, read by the compiled grammar itself: a call whose arguments
    follow the nested schema is taken whole; one with a key the schema does not name stops at
    that key. (The sampled tests below cannot fail by luck alone: this one can.)"""
    tool = FORMATS[fmt]
    functions = [{"name": "forecast", "parameters": FORECAST}]
    grammar = tools_grammar(tool, functions, forced=True, parallel=False)
    matcher = compiler.compile(StructuredOutputsParams(lark=grammar)).matcher()
    place = '{"city": "Paris", "unit": "celsius"}'
    good = tool.body("forecast", f'{{"places": [{place}]}}')
    bad = tool.body("forecast", f'{{"places": [{place[:-1]}, "wind": 3}}]}}')
    text = tool.begin + tool.call_begin + "{}" + tool.call_end + tool.end
    encode = compiler._hf.encode  # the vocabulary the grammar was built for
    whole = encode(text.replace("{}", good), add_special_tokens=False)
    assert matcher.validate_tokens(whole) == len(whole)
    extra = encode(text.replace("{}", bad), add_special_tokens=False)
    assert matcher.validate_tokens(extra) < len(encode(text.split("{}")[0] + bad.split("wind")[0]))


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize(
    "tool",
    [_pydantic_tool(), _plain_tool(FORECAST), _plain_tool(DEFINITIONS)],
    ids=["pydantic_function_tool", "$defs", "definitions"],
)
def test_nested_parameters_are_called_with_exactly_their_keys(small_client, tool, choice):
    out = small_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=[tool],
        tool_choice=CHOICES[choice],
        n=4,
        temperature=1.0,
        seed=3,
        max_tokens=160,
    )
    calls = [c for c in out.choices if c.finish_reason == "tool_calls"]
    if choice != "auto":
        assert calls, [c.finish_reason for c in out.choices]
    for c in calls:
        for call in c.message.tool_calls:
            Forecast.model_validate_json(call.function.arguments)  # extra keys fail here


def test_a_function_without_parameters_is_called_with_none(small_client):
    out = small_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=[{"type": "function", "function": {"name": "now"}}],
        tool_choice="required",
        parallel_tool_calls=False,
        n=3,
        temperature=1.0,
        seed=5,
        max_tokens=60,
    )
    for c in out.choices:
        assert c.finish_reason == "tool_calls"
        assert [json.loads(t.function.arguments) for t in c.message.tool_calls] == [{}] * len(
            c.message.tool_calls
        )


def _answer_format(strict: bool) -> dict:
    schema = _open(Answer.model_json_schema())  # closed by strict, not by the schema
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": strict}}


def test_tools_beside_a_response_format_call_or_answer_in_the_format(small_client):
    """openai-agents' request for an agent with tools and an output_type: each choice either
    calls a tool with valid arguments or answers JSON of the format, with no key it does not
    name (strict)."""
    out = small_client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=[_plain_tool(FORECAST)],
        response_format=_answer_format(strict=True),
        parallel_tool_calls=False,
        n=8,
        temperature=1.0,
        seed=7,
        max_tokens=120,
    )
    finished = [c for c in out.choices if c.finish_reason in ("stop", "tool_calls")]
    assert finished
    for c in finished:
        if c.finish_reason == "tool_calls":
            (call,) = c.message.tool_calls
            Forecast.model_validate_json(call.function.arguments)
        else:
            Answer.model_validate_json(c.message.content)


def test_a_forced_call_beside_a_response_format_follows_its_parameters(small_client):
    out = small_client.chat.completions.parse(
        model="tiny",
        messages=MESSAGES,
        tools=[_pydantic_tool()],
        tool_choice="required",
        response_format=Answer,
        temperature=0,
        max_tokens=160,
    )
    calls = out.choices[0].message.tool_calls
    assert calls and all(isinstance(c.function.parsed_arguments, Forecast) for c in calls)


def test_fields_sent_as_null_take_their_defaults(small_server):
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 4,
        "parallel_tool_calls": None,
        "tool_choice": None,
        "tools": None,
        "temperature": None,
        "stop": None,
        "n": None,
        "stream_options": None,
        "response_format": None,
        "user": None,
    }
    answer = httpx.post(f"{small_server}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"]) == 1


VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["verdict", "n"],
}


@pytest.mark.parametrize(
    ("switches", "shape"),
    [
        ({"whitespace_pattern": "[ ]?"}, r'\{ ?"verdict" ?: ?(true|false) ?, ?"n" ?: ?-?\d+ ?\}'),
        ({"disable_additional_properties": True}, r'\{"verdict": (true|false), "n": -?\d+\}'),
        ({"disable_fallback": True}, None),
    ],
    ids=["whitespace_pattern", "disable_additional_properties", "disable_fallback"],
)
def test_vllm_structured_output_switches_are_honoured(small_server, switches, shape):
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "structured_outputs": {"json": VERDICT_SCHEMA, **switches},
        "n": 4,
        "temperature": 1.0,
        "seed": 1,
        "max_tokens": 60,
    }
    answer = httpx.post(f"{small_server}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    for choice in answer.json()["choices"]:
        if choice["finish_reason"] != "stop":
            continue
        text = choice["message"]["content"]
        jsonschema.validate(json.loads(text), VERDICT_SCHEMA)
        if shape is not None:
            assert re.fullmatch(shape, text), text


@pytest.mark.parametrize(
    ("structured", "param"),
    [
        ({"regex": "a+", "whitespace_pattern": " "}, "structured_outputs"),
        (
            {"json": VERDICT_SCHEMA, "whitespace_pattern": " ", "disable_any_whitespace": True},
            "structured_outputs.whitespace_pattern",
        ),
        ({"json": VERDICT_SCHEMA, "whitespace_pattern": "x" * 257}, "structured_outputs"),
    ],
    ids=["not-json", "contradiction", "too-long"],
)
def test_switches_that_cannot_apply_are_400(small_server, structured, param):
    body = {"model": "tiny", "messages": MESSAGES, "structured_outputs": structured}
    answer = httpx.post(f"{small_server}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith(param)
