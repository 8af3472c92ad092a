"""What routing keeps of a body (target.py): the name, the prefix key, the raw bytes; and the
bodies refused with 400 before routing, as the server's parser refuses them."""

import json
import tracemalloc

import pytest

from kvpilot_common import stored_ids
from kvpilot_common.errors import InvalidRequestError
from kvpilot_gateway.balance import prefix_key
from kvpilot_gateway.target import FORWARDING_ROOM, for_replica, parse, parse_cost

CHAT = {
    "model": "chat",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        {"role": "assistant", "content": "Hello"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": [1, {}]}}}],
    "temperature": 0.5,
}


def test_the_key_and_bytes_are_those_of_the_whole_body():
    body = json.dumps(CHAT).encode()
    wanted = parse(body, 1024)
    assert (wanted.model, wanted.body) == ("chat", body)
    assert wanted.key == prefix_key(CHAT, 1024)  # trimming the parse changes no key
    assert parse(body, None).key is None
    completion = json.dumps({"model": "m", "prompt": [[1, 2, 3], [4]]}).encode()
    assert parse(completion, 1024).key == b"1 2 3"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"model": "m", "prompt": "\\ud800"}', "high surrogate"),
        (b'{"model": "m", "prompt": "\\udc00x"}', "lone low surrogate"),
        (b'{"model": "m", "prompt": "\\ud800\\u0041"}', "high surrogate"),
        (b'{"model": "m", "prompt": "' + "é".encode("latin-1") + b'"}', "utf-8"),
        (b'{"model": "m", "p": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"model": "m", "temperature": Infinity}', "Infinity is not a JSON number"),
        (b'{"model": "m",}', "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b"{}", "model name is required"),
        (b'{"model": 5}', "model name is required"),
        # The gateway's own field: with its secret, a replica would take it as the gateway's.
        (b'{"model": "m", "kvpilot_continue": {"token_ids": [1], "id": "x"}}', "gateway's own"),
        (b'{"model": "m", "kvpilot_continue": null}', "gateway's own"),
        (b'{"kvpilot_continue": 1, "model": "m", "kvpilot_continue": {}}', "gateway's own"),
    ],
)
def test_what_the_server_would_refuse_is_a_400_here(body, why):
    with pytest.raises(InvalidRequestError, match=why):
        parse(body, 1024)


def test_escapes_that_are_not_lone_surrogates_pass():
    pair = b'{"model": "m", "prompt": "\\ud83d\\ude00 \\\\ud800 \\u00e9"}'
    assert parse(pair, 1024).key == "😀 \\ud800 é".encode()


def test_a_renamed_request_keeps_every_field():
    wanted = parse(json.dumps(CHAT).encode(), 1024)
    again = for_replica(wanted, "served", resumable=False)
    assert json.loads(again.body) == {**CHAT, "model": "served"}
    assert again.key == wanted.key and for_replica(wanted, "chat", False).body == wanted.body
    resumed = for_replica(wanted, "served", resumable=True)
    assert json.loads(resumed.body) == {**CHAT, "model": "served", "return_token_ids": True}
    assert resumed.resumable and not again.resumable


def test_a_renamed_body_is_the_clients_bytes_with_the_fields_appended():
    """Not parsed and written again: a 4 MiB body costs one copy, and text that is not ASCII
    stays as it came (json.dumps would escape it to six bytes a character)."""
    objects = b'{"model": "team-a/chat", "messages": [' + b'{"a": 1},' * 450_000 + b"{}]}"
    text = json.dumps({"model": "team-a/chat", "prompt": "é" * 1_500_000}, ensure_ascii=False)
    for body in (objects, text.encode()):
        wanted = parse(body, None)
        tracemalloc.start()
        again = for_replica(wanted, "chat", resumable=True)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert again.body.startswith(body[:-1])
        assert len(again.body) - len(body) <= FORWARDING_ROOM
        assert peak < 2.5 * len(body)  # the new body, and nothing built from the old
        assert parse(again.body, None).model == "chat"  # the last of a repeated key counts
        assert json.loads(again.body)["return_token_ids"] is True


def test_the_parse_cost_bounds_what_the_parse_builds():
    text = json.dumps([{"id": i, "tags": ["a", "b"]} for i in range(6_000)])  # 200 KiB of JSON
    as_prompt = json.dumps({"model": "m", "prompt": text}).encode()
    assert parse_cost(as_prompt) < 4 << 20  # a long prompt of JSON text fits the budget
    empty_arrays = b'{"model": "m", "x": [' + b"[]," * 1_000_000 + b"[]]}"
    assert parse_cost(empty_arrays) > 32 << 20  # past the default budget: refused, not parsed
    small_objects = b'{"model": "m", "x": [' + b'{"a":1},' * 400_000 + b"{}]}"
    assert parse_cost(small_objects) < 32 << 20  # the hook makes these cheap: parsed


def test_a_continuation_names_the_replica_its_id_was_tagged_with():
    tag = stored_ids.replica_tag("10.0.0.7:8000")
    made = stored_ids.new_id(tag)
    body = {"model": "m", "input": "go on", "previous_response_id": made}
    assert parse(json.dumps(body).encode(), None).pinned == tag
    # Anything else names no replica: routed as any request (the replica answers for it).
    for other in (stored_ids.new_id(None), made + "0", made.upper(), 7, None, ["x"]):
        body["previous_response_id"] = other
        assert parse(json.dumps(body).encode(), None).pinned is None, other
    nested = {"model": "m", "input": [{"previous_response_id": made}]}
    assert parse(json.dumps(nested).encode(), None).pinned is None
    # A server is told no tag that is not one (a header is the gateway's, but checked anyway).
    assert stored_ids.tag_of(stored_ids.new_id("../../etc")) is None
