"""Reasoning on the Responses API, on a tiny model whose template opens `<think>` and which
closes its thinking after a while: the output is a reasoning item (its text as reasoning_text)
then a message, held to the openai SDK's own types; the stream's reasoning deltas add up to it
and its final response equals the whole one; `reasoning.effort: none` switches the thinking
off; a reasoning item sent back as input is read and left out of the prompt."""

import json
import shutil
from pathlib import Path

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

EVENTS = TypeAdapter(ResponseStreamEvent)
# A seed whose answer thinks a few tokens, closes the thinking, then writes a message, well
# within ASK's max_output_tokens (the tests check that it does).
SEED = 14
ASK = {"model": "tiny", "input": "Think.", "max_output_tokens": 24, "seed": SEED, "store": False}


def _closing(model: Path) -> None:
    """Make the model close its thinking: `</think>` is three tokens of the 512 (`</`, `think`,
    `>`) that a random model never writes in a row (and the Responses API has no logit_bias to
    push it). A few hidden channels the layers neither read nor write carry, to the output
    head, a constant (so `</` is a little likelier at every step) and which token came last
    (so each piece of the marker follows the one before it)."""
    marker = AutoTokenizer.from_pretrained(model)("</think>", add_special_tokens=False).input_ids
    n = len(marker)
    weights = load_file(model / "model.safetensors")
    for name, w in weights.items():
        if name.startswith("model.layers.") and name.endswith(
            ("o_proj.weight", "down_proj.weight")
        ):
            w[:n, :] = 0  # the layers write nothing to the channels
        elif name.startswith("model.layers.") and name.endswith("_proj.weight"):
            w[:, :n] = 0  # nor read them
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    embed[:, :n] = head[:, :n] = 0
    embed[:, 0], head[marker[0], 0] = 1.0, 8.0
    for i in range(1, n):
        embed[marker[i - 1], i], head[marker[i], i] = 10.0, 30.0
    save_file(weights, model / "model.safetensors")


@pytest.fixture(scope="module")
def base(server_pool, thinking_model, tmp_path_factory):
    """A server of its own: no other module serves these weights (test_thinking's model, which
    never closes its thinking, cannot answer a message after it)."""
    model = tmp_path_factory.mktemp("closing") / "model"
    shutil.copytree(thinking_model, model)
    _closing(model)
    with server_pool.private_tiny(model, "--max-model-len", "1024") as server:
        yield server.base


def _create(base: str, **fields) -> Response:
    reply = httpx.post(f"{base}/v1/responses", json={**ASK, **fields}, timeout=60)
    assert reply.status_code == 200, reply.text
    return Response.model_validate(reply.json())


def _reasoning(response: Response) -> str:
    return "".join(p.text for i in response.output if i.type == "reasoning" for p in i.content)


def test_a_reasoning_item_then_a_message(base):
    whole = _create(base)
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    thought, said = whole.output
    assert [p.type for p in thought.content] == ["reasoning_text"] and thought.summary == []
    assert _reasoning(whole) and "think>" not in _reasoning(whole)
    assert said.content[0].type == "output_text" and whole.output_text == said.content[0].text
    assert whole.usage.output_tokens_details.reasoning_tokens > 0


def test_reasoning_tokens_are_the_tokens_generated_while_thinking(base):
    closed = _create(base).usage
    assert 0 < closed.output_tokens_details.reasoning_tokens < closed.output_tokens
    cut = _create(base, seed=1, max_output_tokens=16)  # still thinking when the tokens ran out
    assert [i.type for i in cut.output] == ["reasoning"] and cut.status == "incomplete"
    assert cut.usage.output_tokens_details.reasoning_tokens == cut.usage.output_tokens == 16


def test_the_stream_carries_the_reasoning_and_ends_equal_to_the_whole_response(base):
    whole = _create(base)
    with httpx.stream(
        "POST", f"{base}/v1/responses", json={**ASK, "stream": True}, timeout=60
    ) as reply:
        assert reply.status_code == 200, reply.read()
        events = [
            EVENTS.validate_python(json.loads(line[6:]))
            for line in reply.iter_lines()
            if line.startswith("data: ")
        ]
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert thought == _reasoning(whole) == _reasoning(final)
    assert text == whole.output_text == final.output_text
    skip = {"id", "created_at", "output", "usage"}  # ids per response; the prompt is cached
    assert final.model_dump(exclude=skip) == whole.model_dump(exclude=skip)
    items = [[i.model_dump(exclude={"id"}) for i in r.output] for r in (final, whole)]
    assert items[0] == items[1]
    details = [r.usage.output_tokens_details for r in (final, whole)]
    assert details[0] == details[1] and final.usage.output_tokens == whole.usage.output_tokens


def test_effort_none_switches_the_thinking_off(base):
    off = _create(base, reasoning={"effort": "none"})
    assert [i.type for i in off.output] == ["message"] and off.output_text
    assert off.usage.output_tokens_details.reasoning_tokens == 0
    on = [_create(base, max_output_tokens=1, reasoning=r) for r in ({"effort": "low"}, None)]
    # The prompt no longer opens <think>; any other effort leaves the template's default on.
    assert off.usage.input_tokens < on[0].usage.input_tokens == on[1].usage.input_tokens
    assert on[0].reasoning.effort == "low" and off.reasoning.effort == "none"


def test_a_reasoning_item_sent_back_is_left_out_of_the_prompt(base):
    first = _create(base)
    thought, said = (i.model_dump(exclude_none=True) for i in first.output)
    assert thought["type"] == "reasoning" and thought["content"][0]["text"]

    def prompt_tokens(*turn: dict) -> int:
        items = [{"role": "user", "content": "Think."}, *turn, {"role": "user", "content": "And?"}]
        return _create(base, input=items, max_output_tokens=1).usage.input_tokens

    assert prompt_tokens(thought, said) == prompt_tokens(said)
    # Sent as text, the same thought would lengthen the prompt: the count above can tell.
    spoken = {"role": "assistant", "content": thought["content"][0]["text"]}
    assert prompt_tokens(spoken, said) > prompt_tokens(said)
