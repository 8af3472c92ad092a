"""Thinking on the Messages API: a template that opens `<think>` and reads `enable_thinking`
answers thinking blocks (streamed as thinking_delta, accumulating to the whole answer),
`thinking: disabled` switches it off, past thinking blocks are dropped from the prompt, and a
model that cannot think refuses `thinking: enabled` in words."""

import anthropic
import pytest
from shapes import GREEDY, message

ASK = [{"role": "user", "content": "Think."}]
ON = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def thinker(server_pool, thinking_model):
    with server_pool.private_tiny(thinking_model, "--max-model-len", "1024") as server:
        yield anthropic.Anthropic(base_url=server.base, api_key="-", max_retries=0, timeout=60)


def test_thinking_comes_back_as_thinking_blocks_streamed_or_not(thinker):
    kwargs = {"model": "tiny", "max_tokens": 30, "messages": ASK, "thinking": ON}
    whole = message(thinker.messages.with_raw_response.create(**kwargs, extra_body=GREEDY).json())
    first = whole.content[0]
    assert first.type == "thinking" and first.thinking and first.signature == ""
    assert "<think>" not in first.thinking
    with thinker.messages.stream(**kwargs, extra_body=GREEDY) as stream:
        kinds = {e.delta.type for e in stream if e.type == "content_block_delta"}
        streamed = stream.get_final_message()
    assert "thinking_delta" in kinds
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]


def test_thinking_disabled_turns_the_templates_switch_off(thinker):
    count = {
        kind: thinker.messages.count_tokens(
            model="tiny", messages=ASK, thinking={"type": kind, **extra}
        ).input_tokens
        for kind, extra in (("enabled", {"budget_tokens": 1024}), ("disabled", {}))
    }
    assert count["disabled"] < count["enabled"]  # the prompt no longer opens <think>
    adaptive = thinker.messages.count_tokens(
        model="tiny", messages=ASK, thinking={"type": "adaptive"}
    )
    assert adaptive.input_tokens == count["enabled"]  # the template's default: it thinks


def test_past_thinking_blocks_are_dropped_from_the_prompt(thinker):
    def turns(blocks):
        return [*ASK, {"role": "assistant", "content": blocks}, {"role": "user", "content": "And?"}]

    answer = {"type": "text", "text": "Yes."}
    thought = {"type": "thinking", "thinking": "a long thought " * 10, "signature": ""}
    counts = [
        thinker.messages.count_tokens(model="tiny", messages=turns(b)).input_tokens
        for b in ([answer], [thought, answer])
    ]
    assert counts[0] == counts[1]


def test_a_model_that_cannot_think_refuses_thinking_in_words(client):
    with pytest.raises(anthropic.BadRequestError, match="does not think"):
        client.messages.create(model="tiny", max_tokens=4, messages=ASK, thinking=ON)
    answer = client.messages.create(
        model="tiny", max_tokens=2, messages=ASK, thinking={"type": "disabled"}
    )
    assert answer.content[0].type == "text"
