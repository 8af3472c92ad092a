"""Structured outputs over HTTP, as clients send them: the official openai client's parse(),
response_format, vLLM's structured_outputs and guided_* fields, streamed and not; every answer
that finishes with `stop` matches its constraint, and every constraint that cannot be compiled
is a 400 naming the field before anything is queued."""

import json
import re
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from kvpilot_common import metric_names as names
from kvpilot_testing.schemas import SCHEMAS

SCHEMA = SCHEMAS["classification"]


class Verdict(BaseModel):
    mood: Literal["happy", "sad"]
    confident: bool
    score: int = Field(ge=0, le=9)


def _chat(**extra):
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Classify: late order"}],
        **extra,
    }


def test_parse_with_a_pydantic_model(small_client):
    for seed in range(6):
        out = small_client.chat.completions.parse(
            **_chat(), response_format=Verdict, max_tokens=60, temperature=1.0, seed=seed
        )
        choice = out.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Verdict)


@pytest.mark.parametrize(
    "extra",
    [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": SCHEMA, "strict": True},
            }
        },
        {"structured_outputs": {"json": SCHEMA}},
        {"guided_json": SCHEMA},
        {"guided_json": json.dumps(SCHEMA), "guided_decoding_backend": "xgrammar"},
    ],
    ids=["response_format", "structured_outputs", "guided_json", "guided_json_text"],
)
def test_json_schema_in_every_spelling(small_client, extra):
    out = small_client.chat.completions.create(
        **_chat(), n=4, max_tokens=160, temperature=1.0, seed=3, extra_body=extra
    )
    finished = [c for c in out.choices if c.finish_reason == "stop"]
    assert finished
    for choice in finished:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_and_text_completions(small_client):
    out = small_client.chat.completions.create(
        **_chat(), max_tokens=80, temperature=0, response_format={"type": "json_object"}
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    text = small_client.completions.create(
        model="tiny",
        prompt="The answer is",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{2,4}"}},
    )
    assert re.fullmatch("[0-9]{2,4}", text.choices[0].text)


@pytest.mark.parametrize(
    ("field", "value", "matches"),
    [
        ("regex", r"[a-c]{3}-[0-9]", lambda t: re.fullmatch(r"[a-c]{3}-[0-9]", t)),
        ("choice", ["red", "green", "blue"], lambda t: t in {"red", "green", "blue"}),
        ("grammar", 'start: "x" ("+" "x")~1..3', lambda t: re.fullmatch(r"x(\+x){1,3}", t)),
        ("grammar", 'root ::= "y" | "yy" | "n"', lambda t: t in {"y", "yy", "n"}),
    ],
    ids=["regex", "choice", "lark", "gbnf"],
)
def test_regex_choice_and_grammars(small_client, field, value, matches):
    for body in ({"structured_outputs": {field: value}}, {f"guided_{field}": value}):
        out = small_client.chat.completions.create(
            **_chat(), n=3, max_tokens=24, temperature=1.0, seed=5, extra_body=body
        )
        for choice in out.choices:
            assert choice.finish_reason == "stop" and matches(choice.message.content)


def test_streaming_equals_non_streaming(small_client):
    kwargs = {
        **_chat(),
        "max_tokens": 80,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    }
    whole = small_client.chat.completions.create(**kwargs).choices[0]
    chunks = list(small_client.chat.completions.create(**kwargs, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"structured_outputs": {"regex": "(a"}}, "structured_outputs", "regex"),
        ({"guided_json": {"type": "strin"}}, "guided_json", "strin"),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "Only one"),
        ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn", "Extra inputs"),
        ({"guided_choice": []}, "guided_choice", "choice"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "json_schema",
        ),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "grammar"),
        ({"guided_decoding_backend": "magic", "guided_regex": "a"}, "guided_decoding_backend", ""),
        ({"guided_json": {"enum": [str(i) for i in range(20000)]}}, "guided_json", "characters"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(small_server, body, param, says):
    answer = httpx.post(f"{small_server}/v1/chat/completions", json={**_chat(), **body}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_constrained_requests_are_counted(small_server, small_client):
    def count() -> float:
        text = httpx.get(f"{small_server}/metrics").text
        found = re.search(
            rf'^{names.STRUCTURED_REQUESTS}{{kind="regex",model="tiny"}} (\S+)$', text, re.M
        )
        return float(found.group(1)) if found else 0.0

    before = count()
    small_client.chat.completions.create(
        **_chat(), max_tokens=8, extra_body={"guided_regex": "[a-z]{1,3}"}
    )
    assert count() == before + 1
    text = httpx.get(f"{small_server}/metrics").text
    assert f"{names.GRAMMAR_COMPILE_TIME}_count" in text
