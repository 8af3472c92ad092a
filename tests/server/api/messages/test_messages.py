"""The Messages API through Anthropic's own client: answers and stream events that its types
accept strictly, a stream that accumulates to the whole answer, tool use and its result,
stop reasons, and count_tokens agreeing with what create reads."""

import json

import httpx
import jsonschema
import pytest
from shapes import GREEDY, event, message, without_ids

ASK = [{"role": "user", "content": "Tell me about the sea."}]
PLACE = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "where": {
            "type": "object",
            "properties": {"floor": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["floor"],
            "additionalProperties": False,
        },
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "where", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"name": "locate", "description": "Where something is.", "input_schema": PLACE},
    {"name": "noop", "input_schema": {"type": "object", "properties": {}}},
]
FORCED = {"type": "tool", "name": "locate"}


def _create(client, **kwargs):
    raw = client.messages.with_raw_response.create(model="tiny", extra_body=GREEDY, **kwargs)
    return message(raw.json()), raw.headers


def test_create_answers_a_message(client):
    answer, _ = _create(client, max_tokens=12, messages=ASK, system="Be brief.")
    assert answer.id.startswith("msg_") and answer.role == "assistant" and answer.model == "tiny"
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.stop_sequence is None
    usage = answer.usage
    assert usage.output_tokens <= 12 and usage.input_tokens + usage.cache_read_input_tokens > 5
    assert usage.cache_creation_input_tokens == 0


def test_max_tokens_is_the_stop_reason(client):
    answer, _ = _create(client, max_tokens=3, messages=ASK)
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 3


def test_a_stop_sequence_ends_the_answer_and_is_named(client):
    whole, _ = _create(client, max_tokens=24, messages=ASK)
    text = whole.content[0].text
    stop = text[6:9]
    assert len(stop) == 3 and stop.strip(), text
    cut, _ = _create(client, max_tokens=24, messages=ASK, stop_sequences=["\x00zz", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]


@pytest.mark.parametrize("forced", [False, True], ids=["text", "tool_use"])
def test_stream_accumulates_to_the_whole_answer(client, forced):
    kwargs = {"model": "tiny", "max_tokens": 60, "messages": ASK, "extra_body": GREEDY}
    if forced:
        kwargs |= {"tools": TOOLS, "tool_choice": FORCED}
    whole = message(client.messages.with_raw_response.create(**kwargs).json())
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert without_ids(streamed.content) == without_ids(whole.content)
    assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason, None)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    total = [u.input_tokens + u.cache_read_input_tokens for u in (streamed.usage, whole.usage)]
    assert total[0] == total[1]
    if forced:
        assert whole.stop_reason == "tool_use" and whole.content[-1].type == "tool_use"


def test_raw_stream_events_are_the_sdks(small_server):
    body = {"model": "tiny", "max_tokens": 80, "messages": ASK, "stream": True, **GREEDY}
    body |= {"tools": TOOLS, "tool_choice": FORCED}
    events = []
    with httpx.stream("POST", f"{small_server}/v1/messages", json=body, timeout=60) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                parsed = event(json.loads(line[len("data: ") :]))
                assert parsed.type == name
                events.append(parsed)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0].message.content == [] and events[0].message.stop_reason is None
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.index for s in starts] == list(range(len(starts)))
    assert kinds.count("content_block_stop") == len(starts)
    tool = next(s for s in starts if s.content_block.type == "tool_use")
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.index == tool.index
    )
    jsonschema.validate(json.loads(partial), PLACE)
    assert tool.content_block.id.startswith("toolu_") and tool.content_block.name == "locate"
    assert events[-2].delta.stop_reason == "tool_use"


def test_forced_tool_use_then_its_result(client):
    answer, _ = _create(client, max_tokens=80, messages=ASK, tools=TOOLS, tool_choice=FORCED)
    assert answer.stop_reason == "tool_use"
    call = answer.content[-1]
    assert call.type == "tool_use" and call.name == "locate" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, PLACE)
    turn = [*ASK, {"role": "assistant", "content": answer.content}]

    def result(content, **extra):
        block = {"type": "tool_result", "tool_use_id": call.id, "content": content, **extra}
        return [*turn, {"role": "user", "content": [block]}]

    after, _ = _create(client, max_tokens=8, messages=result("On the third floor."), tools=TOOLS)
    assert after.content and after.content[0].type == "text"
    # The result reaches the prompt: a longer one (or the error mark) costs more tokens.
    count = [
        client.messages.count_tokens(model="tiny", messages=m, tools=TOOLS).input_tokens
        for m in (result("x"), result("x " * 20), result("x", is_error=True))
    ]
    assert count[0] < count[1] and count[0] < count[2]


def test_count_tokens_is_the_prompt_create_reads(client):
    body = {"messages": ASK, "system": [{"type": "text", "text": "Be brief."}], "tools": TOOLS}
    counted = client.messages.count_tokens(model="tiny", **body).input_tokens
    answer, _ = _create(client, max_tokens=4, **body)
    assert counted == answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    bare = client.messages.count_tokens(model="tiny", messages=ASK).input_tokens
    assert bare < counted  # the system prompt and the tools are in it


def test_cache_control_is_accepted_and_the_prefix_cache_reads(client):
    system = [{"type": "text", "text": "You answer. " * 30, "cache_control": {"type": "ephemeral"}}]
    first, _ = _create(client, max_tokens=2, messages=ASK, system=system)
    again, _ = _create(client, max_tokens=2, messages=ASK, system=system)
    assert again.usage.cache_read_input_tokens > 0
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == total
