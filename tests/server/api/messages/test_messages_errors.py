"""What the Messages API refuses, in Anthropic's error shape with the status its client maps
to its exceptions: bad bodies, an unknown model, what kvpilot cannot serve (images, server
tools, a prefilled answer, fields that would change the answer), and hostile bodies."""

import anthropic
import httpx
import pytest
from anthropic.types.shared import ErrorResponse
from shapes import GREEDY, message, unknown_keys

from kvpilot_common.http.errors import error_response
from kvpilot_server.api.fields import IGNORED_HEADER
from kvpilot_server.api.messages_api.errors import reshaped

ASK = [{"role": "user", "content": "Hi"}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}


def _error(exc: anthropic.APIStatusError, kind: str) -> str:
    body = ErrorResponse.model_validate(exc.body)
    assert not unknown_keys(body) and body.type == "error" and body.error.type == kind
    return body.error.message


def test_a_bad_body_is_a_400_in_anthropics_shape(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="tiny", max_tokens=0, messages=ASK)
    assert "max_tokens" in _error(caught.value, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="tiny", max_tokens=4, messages=ASK, extra_body={"top_p": "1"})
    assert "top_p" in _error(caught.value, "invalid_request_error")


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert "claude-nope" in _error(caught.value, "not_found_error")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ([{"type": "text", "text": "What is this?"}, IMAGE], "kvpilot serves text models"),
        ([{"type": "hologram", "data": "x"}], "'hologram' are not supported"),
        ([{"type": "text", "text": "x", "flavour": "sweet"}], "flavour"),
    ],
    ids=["image", "unknown-type", "unknown-key"],
)
def test_blocks_kvpilot_cannot_read_are_refused_in_words(client, content, why):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": content}]
        )
    assert why in _error(caught.value, "invalid_request_error")


def test_server_tools_are_refused_in_words(client):
    for tool in (
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "bash_20250124", "name": "bash"},
    ):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="tiny", max_tokens=4, messages=ASK, tools=[tool])
        message_ = _error(caught.value, "invalid_request_error")
        assert tool["type"] in message_ and "no server tools" in message_


def test_a_final_assistant_turn_is_refused(client):
    turns = [*ASK, {"role": "assistant", "content": "The answer is"}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="tiny", max_tokens=4, messages=turns)
    assert "prefill" in _error(caught.value, "invalid_request_error")


def test_fields_that_change_the_answer_are_refused_and_others_named(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="tiny", max_tokens=4, messages=ASK, extra_body={"container": "c-1"}
        )
    assert "containers" in _error(caught.value, "invalid_request_error")
    raw = client.messages.with_raw_response.create(
        model="tiny",
        max_tokens=2,
        messages=ASK,
        metadata={"user_id": "u-1"},
        service_tier="auto",
        extra_body={**GREEDY, "novel_hint": 1},
    )
    message(raw.json())
    assert raw.headers[IGNORED_HEADER].split(", ") == ["metadata", "novel_hint"]


def test_hostile_bodies_are_4xx_in_anthropics_shape(small_server):
    url = f"{small_server}/v1/messages"
    many = [{"type": "text", "text": "x"}] * 5000
    deep: object = {}
    for _ in range(3000):
        deep = {"a": deep}
    bodies = [
        {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": many}]},
        {"model": "tiny", "max_tokens": 4, "messages": ASK, "tools": [{"name": "t"}] * 200},
        {"model": "tiny", "max_tokens": 4, "messages": ASK, "stop_sequences": ["s"] * 100},
    ]
    answers = [httpx.post(url, json=body, timeout=60) for body in bodies]
    nested = '{"model": "tiny", "max_tokens": 4, "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    answers.append(httpx.post(url, content=nested, timeout=60))
    answers.append(httpx.post(url, content=b"{not json", timeout=60))
    for answer in answers:
        assert answer.status_code == 400, answer.text
        body = ErrorResponse.model_validate(answer.json())
        assert body.error.type == "invalid_request_error" and body.error.message


def test_reshaped_keeps_status_and_headers():
    refused = error_response(429, "Slow down", headers={"Retry-After": "3"})
    answer = reshaped(refused)
    assert answer.status_code == 429 and answer.headers["retry-after"] == "3"
    body = ErrorResponse.model_validate_json(bytes(answer.body))
    assert (body.error.type, body.error.message) == ("rate_limit_error", "Slow down")
    assert int(answer.headers["content-length"]) == len(answer.body)
