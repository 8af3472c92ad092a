"""/v1/responses with the official openai SDK against a real server: plain, streamed (every
event validated against the SDK's own types, the stream's final response equal to the whole
one), function tools and their outputs sent back, text.format json_schema, stored responses
continued with previous_response_id, read and deleted, and what kvpilot refuses in words."""

import json
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kvpilot_common import metric_names as names
from kvpilot_server.api.fields import REFUSED_RESPONSES
from kvpilot_server.api.responses_api.request import ResponsesRequest

TABLE = Path(__file__).parents[4] / "docs" / "api-fields.md"
EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
    "strict": True,
}


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verdict: bool
    reason: str = Field(max_length=20)


def _strict(body: dict) -> Response:
    """The SDK's own model, validated strictly: a missing or mistyped field fails here."""
    return Response.model_validate(body, strict=False)


def _events(small_server: str, body: dict) -> list:
    with httpx.stream(
        "POST", f"{small_server}/v1/responses", json={**body, "stream": True}, timeout=60
    ) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    return [EVENTS.validate_python(json.loads(line[6:])) for line in lines]


def test_a_plain_response(small_client):
    reply = small_client.responses.create(
        model="tiny", input="Tell me about rivers.", max_output_tokens=12, temperature=0
    )
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[0].type == "message" and reply.output_text
    assert reply.usage.output_tokens == 12 and reply.usage.input_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + 12


def test_the_stream_ends_equal_to_the_whole_response(small_server, small_client):
    body = {
        "model": "tiny",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]}],
        "instructions": "Answer briefly.",
        "max_output_tokens": 16,
        "seed": 7,
        "metadata": {"case": "stream"},
    }
    whole = httpx.post(f"{small_server}/v1/responses", json=body, timeout=60).json()
    events = _events(small_server, body)
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert [events[0].type, events[1].type] == ["response.created", "response.in_progress"]
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    streamed_text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed_text == _strict(whole).output_text == final.output_text
    skip = {"id", "created_at", "output", "usage"}  # the second run's prompt is cached
    assert {k: v for k, v in final.model_dump().items() if k not in skip} == {
        k: v for k, v in _strict(whole).model_dump().items() if k not in skip
    }
    assert [i.type for i in final.output] == [i["type"] for i in whole["output"]]
    assert final.usage.output_tokens == whole["usage"]["output_tokens"]
    assert final.usage.input_tokens_details.cached_tokens > 0
    assert final.metadata == {"case": "stream"} and final.instructions == "Answer briefly."


def test_a_forced_function_call_and_its_output_sent_back(small_client):
    first = small_client.responses.create(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        # One call, greedy: whatever ran before on the shared server, it is whole in 60 tokens.
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=60,
    )
    calls = [i for i in first.output if i.type == "function_call"]
    assert calls and calls[0].name == "weather" and calls[0].call_id.startswith("call_")
    assert set(json.loads(calls[0].arguments)) == {"city"}
    # The conversation sent back whole (store: false), as openai-agents does without a store.
    second = small_client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            *[c.model_dump(exclude_none=True) for c in calls],
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        tools=[WEATHER],
        store=False,
        max_output_tokens=8,
    )
    assert second.status in ("completed", "incomplete") and second.store is False
    with pytest.raises(openai.NotFoundError):
        small_client.responses.retrieve(second.id)


def test_a_json_schema_format_holds(small_client):
    reply = small_client.responses.create(
        model="tiny",
        input="Is water wet?",
        text={
            "format": {
                "type": "json_schema",
                "name": "verdict",
                "schema": Verdict.model_json_schema(),
                "strict": True,
            }
        },
        max_output_tokens=80,
    )
    assert reply.status == "completed", reply.output
    Verdict.model_validate_json(reply.output_text)
    assert reply.text.format.type == "json_schema"


def test_previous_response_id_continues_three_turns_and_the_store_reads_and_deletes(
    small_client,
):
    first = small_client.responses.create(
        model="tiny", input="My name is Ada.", max_output_tokens=4, temperature=0
    )
    second = small_client.responses.create(
        model="tiny",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    third = small_client.responses.create(
        model="tiny",
        input="And again?",
        previous_response_id=second.id,
        max_output_tokens=4,
        temperature=0,
    )
    # Each turn's prompt holds the ones before it, answers included.
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert small_client.responses.retrieve(second.id).output_text == second.output_text
    small_client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError, match="No stored response"):
        small_client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        small_client.responses.create(model="tiny", input="Hi", previous_response_id=second.id)


def _requests_by_api(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == names.REQUESTS:
                api = sample.labels["api"]
                counts[api] = counts.get(api, 0) + sample.value
    return counts


def test_each_api_counts_its_requests_under_its_own_label(small_server, small_client):
    before = _requests_by_api(small_server)
    small_client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    small_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    small_client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{small_server}/v1/messages", json=body, timeout=30).status_code == 200
    after = _requests_by_api(small_server)
    grown = {api: after[api] - before.get(api, 0) for api in after}
    assert {api: n for api, n in grown.items() if n} == {
        "responses": 1,
        "chat": 1,
        "completions": 1,
        "messages": 1,
    }


def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses(small_server, small_client):
    """A conversation longer than the context: `auto` answers from its latest turns (the
    system turn kept), `disabled` and the server's own policy (reject) refuse it in words."""
    turn = "the quick brown fox jumps over the lazy dog " * 40
    conversation = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        conversation += [
            {"role": "user", "content": f"{i} {turn}"},
            {"role": "assistant", "content": "Noted."},
        ]
    conversation.append({"role": "user", "content": "Sum it up."})
    asked = {"model": "tiny", "input": conversation, "max_output_tokens": 4}
    cut = small_client.responses.create(**asked, truncation="auto")
    assert cut.truncation == "auto" and 0 < cut.usage.input_tokens <= 1024 - 4
    for refused in ({"truncation": "disabled"}, {}):
        answer = httpx.post(f"{small_server}/v1/responses", json=asked | refused, timeout=30)
        assert answer.status_code == 400 and "context" in answer.json()["error"]["message"]
    whole = small_client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    assert whole.truncation == "disabled"


def test_input_items_list_a_stored_responses_own_input_in_pages(small_server, small_client):
    """The items as sent (a client's id kept, one added where missing), validated against the
    SDK's own item types, newest first by default, paged by `after`; a bad query is a 400."""
    sent = [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": "Hello", "id": "msg_mine"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "user", "content": "And?"},
    ]
    made = small_client.responses.create(model="tiny", input=sent, max_output_tokens=2)
    listed = list(small_client.responses.input_items.list(made.id, order="asc", limit=3))
    assert [(i.type, getattr(i, "role", None)) for i in listed] == [
        (item["type"], item.get("role")) for item in sent
    ]
    assert listed[2].id == "msg_mine" and len({i.id for i in listed}) == len(sent)
    newest = small_client.responses.input_items.list(made.id, limit=2)
    assert [i.id for i in newest.data] == [i.id for i in listed[::-1][:2]] and newest.has_more
    url = f"{small_server}/v1/responses/{made.id}/input_items"
    for query, param in [
        ({"limit": 0}, "limit"),
        ({"order": "up"}, "order"),
        ({"after": "nope"}, "after"),
        ({"include": "x"}, "include"),
    ]:
        refused = httpx.get(url, params=query, timeout=10)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    string = small_client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    (only,) = small_client.responses.input_items.list(string.id)
    assert only.type == "message" and only.content[0].text == "Hi"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "hosted tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "text models"),
        ({"input": [{"type": "computer_call", "id": "x"}]}, "computer_call"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"text": {"format": {"type": "json_schema"}}}, "needs a name and a schema"),
    ],
)
def test_what_kvpilot_cannot_do_is_a_400_that_says_so(small_server, body, words):
    sent = {"model": "tiny", "input": "Hi", **body}
    reply = httpx.post(f"{small_server}/v1/responses", json=sent, timeout=30)
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]


def _rows() -> dict[str, str]:
    """docs/api-fields.md's /v1/responses table: field -> answer."""
    text = TABLE.read_text().split("## `/v1/responses`")[1].split("\n## ")[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_the_fields_table_is_the_code():
    rows = _rows()
    assert {f for f, answer in rows.items() if answer == "refused"} == set(REFUSED_RESPONSES)
    kept = {f for f, answer in rows.items() if answer in ("honoured", "limited", "ignored")}
    assert kept == set(ResponsesRequest.model_fields)
