"""Hostile /v1/responses bodies, sent raw: deep nesting, arrays past the documented limits
(docs/limits.md), huge content, unknown item and content types, every field of a wrong type,
ids never stored, non-JSON, NaN, a body over the size limit. Each is a 4xx in OpenAI's error
shape whose message says why, a streamed one too (the refusal comes before any event), and
afterwards the server is as it was: a stored response unchanged and continued, a stream
answered fully, nothing left running and no KV block held."""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types.responses import Response

from kvpilot_server.api.responses_api.request import MAX_ITEMS, ResponsesRequest
from kvpilot_testing.adversary import error_shape, is_idle, wait_idle

ASK = {"model": "tiny", "input": "Hi", "max_output_tokens": 4}
MIB = 1 << 20


def _user(content: Any) -> dict:
    return {**ASK, "input": [{"role": "user", "content": content}]}


def _nested(depth: int) -> str:
    """A tool's parameters `depth` objects deep: past the JSON parser's nesting limit."""
    return '{"a":' * depth + "1" + "}" * depth


TEXT = {"type": "input_text", "text": "x"}
# (body: a dict sent as JSON, or the raw bytes; status; words the error message must hold)
CASES = {
    "deep-arrays": (
        b'{"model":"tiny","input":' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
        "recursion",
    ),
    "deep-parameters": (
        b'{"model":"tiny","input":"Hi","tools":[{"type":"function","name":"f","parameters":'
        + _nested(3000).encode()
        + b"}]}",
        400,
        "recursion",
    ),
    "too-many-items": (
        {**ASK, "input": [{"role": "user", "content": "x"}] * (MAX_ITEMS + 1)},
        400,
        f"at most {MAX_ITEMS} items",
    ),
    "too-many-parts": (_user([TEXT] * (MAX_ITEMS + 1)), 400, f"at most {MAX_ITEMS} items"),
    "too-many-output-parts": (
        {
            **ASK,
            "input": [{"type": "function_call_output", "call_id": "c", "output": [TEXT] * 3000}],
        },
        400,
        f"at most {MAX_ITEMS} items",
    ),
    "huge-part": (_user([{"type": "input_text", "text": "x " * (3 * MIB // 2)}]), 400, "context"),
    "too-many-tools": (
        {**ASK, "tools": [{"type": "function", "name": "f"}] * 129},
        400,
        "at most 128",
    ),
    "too-much-metadata": ({**ASK, "metadata": {str(i): "v" for i in range(17)}}, 400, "16"),
    "unknown-item": ({**ASK, "input": [{"type": "hologram"}]}, 400, "'hologram' are not"),
    "unknown-item-streamed": (
        {**ASK, "input": [{"type": "hologram"}], "stream": True},
        400,
        "'hologram' are not",
    ),
    "item-not-an-object": ({**ASK, "input": [5]}, 400, "should be an object"),
    "unknown-role": (
        {**ASK, "input": [{"role": "god", "content": "x"}]},
        400,
        "'user', 'assistant'",
    ),
    "call-without-call-id": (
        {**ASK, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        400,
        "call_id: Field required",
    ),
    "unknown-part": (_user([{"type": "input_hologram", "text": "x"}]), 400, "'input_hologram'"),
    "image-part": (_user([{"type": "input_image", "image_url": "x"}]), 400, "text models"),
    "part-text-a-number": (
        _user([{"type": "input_text", "text": 5}]),
        400,
        "text: Input should be a valid string",
    ),
    "unknown-output-part": (
        {**ASK, "input": [{"type": "function_call_output", "call_id": "c", "output": [{}]}]},
        400,
        "type: Field required",
    ),
    "input-a-number": ({**ASK, "input": 5}, 400, "input.list: Input should be a valid array"),
    "input-missing": ({"model": "tiny"}, 400, "input: Field required"),
    "input-empty": ({**ASK, "input": []}, 400, "input is empty"),
    "tools-a-string": ({**ASK, "tools": "x"}, 400, "tools: Input should be a valid array"),
    "unknown-format": ({**ASK, "text": {"format": {"type": "nope"}}}, 400, "'json_schema'"),
    "unknown-effort": ({**ASK, "reasoning": {"effort": "max"}}, 400, "'xhigh'"),
    "named-choice-without-name": (
        {**ASK, "tool_choice": {"type": "function"}},
        400,
        "tool_choice.function.name: Field required",
    ),
    "unknown-choice": ({**ASK, "tool_choice": "sometimes"}, 400, "'required'"),
    "zero-tokens": ({**ASK, "max_output_tokens": 0}, 400, "greater than or equal to 1"),
    "tokens-past-the-context": ({**ASK, "max_output_tokens": 10**30}, 400, "context length"),
    "seed-past-64-bits": ({**ASK, "seed": 2**70}, 400, "64 bits"),
    "long-previous-id": ({**ASK, "previous_response_id": "r" * 200}, 400, "at most 128"),
    "refused-field": ({**ASK, "background": True}, 400, "background"),
    "unknown-model": ({**ASK, "model": "nope"}, 404, "'nope' does not exist"),
    "nan": (b'{"model":"tiny","input":"Hi","temperature":NaN}', 400, "finite number"),
    "infinity": (b'{"model":"tiny","input":"Hi","top_p":Infinity}', 400, "finite number"),
    "not-json": (b"{not json", 400, "not valid JSON"),
    "not-utf8": (b'{"model":"tiny","input":"\xff"}', 400, "not valid JSON"),
    "lone-surrogate": (b'{"model":"tiny","input":"\\ud800"}', 400, "not valid JSON"),
    "an-array": (b"[]", 400, "must be a JSON object"),
    "over-the-size-limit": ({**ASK, "input": "x" * (5 * MIB)}, 413, "exceeds 4194304 bytes"),
}


@pytest.fixture(scope="module")
def http(small_server) -> Iterator[httpx.Client]:
    """One connection for the batch (a new one after a 413, which closes it)."""
    with httpx.Client(base_url=small_server, timeout=60) as client:
        yield client


def _post(http: httpx.Client, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return http.post("/v1/responses", content=content, headers=headers)


def _refusal(reply: httpx.Response, status: int) -> str:
    """The error's message, once the reply is `status` in OpenAI's error shape."""
    assert reply.status_code == status, reply.text[:500]
    assert reply.headers["content-type"].startswith("application/json")
    error = error_shape(reply)
    assert error and isinstance(error["message"], str), reply.text[:500]
    return error["message"]


@pytest.mark.parametrize(("body", "status", "words"), CASES.values(), ids=CASES.keys())
def test_a_hostile_body_is_a_4xx_that_says_why(http, body, status, words):
    assert words in _refusal(_post(http, body), status)


@pytest.mark.parametrize("field", sorted(ResponsesRequest.model_fields))
def test_every_field_of_a_wrong_type_is_a_400_naming_it(http, field):
    # A list holding an empty object is no field's type: not a string, number, bool or
    # object, and its object lacks what an item, a tool or a choice needs.
    sent = {**ASK, field: [{}]}
    reply = _post(http, sent)
    message = _refusal(reply, 400)
    assert message.startswith(field) and error_shape(reply)["param"].startswith(field)


def test_an_id_never_stored_is_a_404_that_says_why(http):
    unknown = "resp_0123456789abcdef0123456789abcdef"
    for stream in (False, True):
        sent = {**ASK, "previous_response_id": unknown, "stream": stream}
        message = _refusal(_post(http, sent), 404)
        assert unknown in message and "never stored" in message
    for method in ("GET", "DELETE"):
        reply = http.request(method, f"/v1/responses/{unknown}")
        assert "never stored" in _refusal(reply, 404)


def test_the_hostile_batch_changes_nothing_else(small_server, http):
    kept = http.post("/v1/responses", json={**ASK, "temperature": 0}).json()
    for body, status, _ in CASES.values():
        assert _post(http, body).status_code == status
    assert http.get(f"/v1/responses/{kept['id']}").json() == kept
    # A stored conversation goes on, streamed, and its stream answers to the end.
    sent = {**ASK, "input": "And?", "previous_response_id": kept["id"], "stream": True}
    with http.stream("POST", "/v1/responses", json=sent) as reply:
        assert reply.status_code == 200, reply.read()
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data:")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = Response.model_validate(events[-1]["response"])
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final.output_text == deltas and final.usage.output_tokens > 0
    assert final.usage.input_tokens > kept["usage"]["input_tokens"]  # the history was read
    gauges = wait_idle(small_server)
    assert is_idle(gauges), gauges  # nothing waiting, running or admitted; no KV block held
