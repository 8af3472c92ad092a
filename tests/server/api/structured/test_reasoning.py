"""A reasoning model's answer: its template opens `<think>` in the prompt, the thinking goes to
reasoning_content, and a JSON schema holds on what follows `</think>`, not on the thinking."""

import json

import jsonschema
import openai
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from kvpilot_testing.schemas import SCHEMAS

SCHEMA = SCHEMAS["person"]


@pytest.fixture(scope="module")
def client(server_pool, thinking_model):
    with server_pool.private_tiny(thinking_model, "--max-model-len", "1024") as server:
        yield OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def test_schema_holds_after_the_thinking(client, thinking_model):
    tokenizer = AutoTokenizer.from_pretrained(thinking_model)
    # Push the random model towards closing its thinking soon; the mask keeps these tokens
    # out of the JSON once it has.
    bias = {str(t): 6.0 for t in tokenizer("</think>").input_ids}
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Who is it?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        logit_bias=bias,
        n=8,
        temperature=1.0,
        seed=7,
        max_tokens=300,
    )
    finished = [c for c in out.choices if c.finish_reason == "stop"]
    assert finished
    assert any(c.message.model_dump()["reasoning_content"] for c in finished)
    for choice in finished:
        message = choice.message.model_dump()
        assert "</think>" not in (message["reasoning_content"] or "")
        jsonschema.validate(json.loads(message["content"]), SCHEMA)


def test_streamed_reasoning_equals_whole(client):
    kwargs = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Think."}],
        "temperature": 0,
        "max_tokens": 40,
    }
    whole = client.chat.completions.create(**kwargs).choices[0].message.model_dump()
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta.model_dump() if chunk.choices else {}
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    assert whole["reasoning_content"] and reasoning == whole["reasoning_content"]
    assert content == (whole["content"] or "")


def test_template_variables_turn_thinking_off(client):
    kwargs = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Think."}],
        "temperature": 0,
        "max_tokens": 20,
    }
    thinking = client.chat.completions.create(**kwargs)
    plain = client.chat.completions.create(
        **kwargs, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert plain.usage.prompt_tokens < thinking.usage.prompt_tokens  # no "<think>" opened
    assert thinking.choices[0].message.model_dump()["reasoning_content"]
    assert plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(
            **kwargs, extra_body={"chat_template_kwargs": {"messages": []}}
        )
