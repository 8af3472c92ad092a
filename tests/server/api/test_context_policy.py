"""--context-overflow truncate-oldest, and a non-streaming client that leaves, on a server that
runs at most two sequences at a time (so a long request is still running when the client goes)."""

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from kvpilot_common import metric_names as names
from kvpilot_server.api.context import drop_oldest_turns
from kvpilot_server.api.prompts import chat_prompt
from kvpilot_server.engine.runtime.inputs import InputProcessor

# test_vllm_metrics.py asks for the same flags: the pool starts this server once for both.
FLAGS = ("--context-overflow", "truncate-oldest", "--max-num-seqs", "2")


@pytest.fixture(scope="module")
def truncating(server_pool, tiny_dir):
    with server_pool.tiny(tiny_dir("llama"), *FLAGS) as server:
        yield server.base


def _conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 8})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "rivers flow " * 8})
    messages.append({"role": "user", "content": "And the sea?"})
    return messages


def test_oldest_turns_are_dropped_until_it_fits(truncating, client, tiny_dir):
    messages = _conversation(turns=8)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=16)
    other = openai.OpenAI(base_url=f"{truncating}/v1", api_key="unused", max_retries=0)
    raw = other.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=16, temperature=0
    )
    dropped = int(raw.headers["x-kvpilot-dropped-messages"])
    assert dropped > 0 and dropped % 2 == 0  # whole turns: a question and its answer
    kept = [messages[0], *messages[1 + dropped :]]
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir("llama"))
    ids = tokenizer.apply_chat_template(kept, add_generation_prompt=True, return_dict=True)
    out = raw.parse()
    assert out.usage.prompt_tokens == len(ids["input_ids"])
    assert out.usage.prompt_tokens + 16 <= 256
    # Dropping one turn fewer would not have fitted: only what had to go went.
    longer = [messages[0], *messages[dropped - 1 :]]
    ids = tokenizer.apply_chat_template(longer, add_generation_prompt=True, return_dict=True)
    assert len(ids["input_ids"]) + 16 > 256


def test_a_last_turn_too_long_on_its_own_is_still_rejected(truncating):
    other = openai.OpenAI(base_url=f"{truncating}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "word " * 300}]
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        other.chat.completions.create(model="tiny", messages=messages, max_tokens=4)


def test_drop_oldest_turns_keeps_system_and_starts_at_a_user_turn():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1" * 10},
        {"role": "assistant", "content": "a1" * 10},
        {"role": "assistant", "content": "a1b" * 10},
        {"role": "user", "content": "u2" * 10},
        {"role": "assistant", "content": "a2" * 10},
        {"role": "user", "content": "u3"},
    ]

    def size(kept: list[dict]) -> int:
        return sum(len(m["content"]) for m in kept)

    assert drop_oldest_turns(messages, lambda kept: size(kept) <= 1000) == (messages, 0)
    kept, dropped = drop_oldest_turns(messages, lambda kept: size(kept) <= 70)
    assert dropped == 3 and kept == [messages[0], *messages[4:]]
    kept, dropped = drop_oldest_turns(messages, lambda kept: size(kept) <= 5)
    assert dropped == 5 and kept == [messages[0], messages[-1]]  # the caller then rejects it


def _engine_state(base: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for sample in family.samples:
            key = sample.name + (
                f"/{sample.labels['outcome']}" if "outcome" in sample.labels else ""
            )
            values[key] = values.get(key, 0.0) + sample.value
    return values


def test_non_streaming_client_that_leaves_aborts_its_request(truncating):
    body = {
        "model": "tiny",
        "prompt": "Once upon a time",
        "n": 8,
        "max_tokens": 200,
        "ignore_eos": True,
    }
    before = _engine_state(truncating)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{truncating}/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    # The aborts are counted when the client leaves; the engine's gauges follow at its next
    # step (they come from the snapshot it publishes), so wait for both.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = _engine_state(truncating)
        aborted = state[f"{names.REQUESTS}/abort"] - before.get(f"{names.REQUESTS}/abort", 0)
        busy = state[names.REQUESTS_RUNNING] + state[names.REQUESTS_WAITING]
        if aborted == 8 and busy == 0 and state[names.KV_CACHE_USAGE] == 0:
            break
        time.sleep(0.05)
    assert state[f"{names.REQUESTS}/abort"] - before.get(f"{names.REQUESTS}/abort", 0) == 8
    assert state[names.REQUESTS_RUNNING] == 0 and state[names.REQUESTS_WAITING] == 0
    assert state[names.KV_CACHE_USAGE] == 0
    generated = state[names.GENERATION_TOKENS] - before[names.GENERATION_TOKENS]
    assert generated < 8 * 200, "the engine stopped generating when the client left"


def test_truncation_templates_about_one_context_not_the_whole_conversation(tiny_dir):
    """A conversation of megabytes costs about one context's worth of templating: candidates
    are tried from the end, and a text too long for the context in any tokenization is
    refused from its length alone."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir("llama"))
    inputs = InputProcessor(tokenizer, len(tokenizer), max_model_len=256)
    templated: list[int] = []
    real = inputs.chat

    def counting(messages, *rest):
        templated.append(sum(len(m["content"]) for m in messages))
        return real(messages, *rest)

    inputs.chat = counting
    messages = _conversation(turns=5000)  # about a megabyte
    ids, dropped = chat_prompt(inputs, messages, 16, "truncate-oldest")
    assert len(ids) + 16 <= 256 and dropped > 9000
    assert max(templated) <= 256 * inputs.max_token_chars
    assert len(templated) <= 40  # galloping then bisection: logarithmic in the turns
    longer = [messages[0], *messages[dropped - 1 :]]
    assert len(real(longer)) + 16 > 256  # and still only what had to go went
