"""The official openai client against a live `kvpilot serve` (tiny model for speed)."""

import httpx
import openai
import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir("llama"))


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_completion_usage_matches_tokenizer(client, tokenizer):
    messages = [{"role": "user", "content": "Tell me about rivers."}]
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=9, temperature=0
    )
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert out.usage.prompt_tokens == len(prompt)
    assert out.usage.completion_tokens == 9 and out.choices[0].finish_reason == "length"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content


def test_streamed_chat_equals_non_streamed(client):
    kwargs = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    assert chunks[-2].choices[0].finish_reason == "length"


def test_completion_with_token_ids_seed_and_stop(client):
    first = client.completions.create(
        model="tiny", prompt=[1, 2, 3, 4], max_tokens=10, temperature=1.0, seed=5
    )
    again = client.completions.create(
        model="tiny", prompt=[1, 2, 3, 4], max_tokens=10, temperature=1.0, seed=5
    )
    assert first.choices[0].text == again.choices[0].text
    text = first.choices[0].text
    stop = text[3:6]
    cut = client.completions.create(
        model="tiny", prompt=[1, 2, 3, 4], max_tokens=10, temperature=1.0, seed=5, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs(client):
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob == c.top_logprobs[0].logprob for c in content)  # greedy picks the top


def test_context_overflow_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens") as e:
        client.completions.create(model="tiny", prompt=[5] * 250, max_tokens=20)
    assert e.value.body["param"] == "messages" or e.value.body["type"] == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
    ],
)
def test_bad_input_gets_openai_shaped_400(tiny_server, body, fragment):
    response = httpx.post(
        f"{tiny_server}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


def test_huge_body_is_413(tiny_server):
    response = httpx.post(f"{tiny_server}/v1/completions", content=b"x" * (5 << 20))
    assert response.status_code == 413 and "error" in response.json()


def test_tokenize_and_detokenize_round_trip(tiny_server, tokenizer):
    ids = httpx.post(f"{tiny_server}/tokenize", json={"prompt": "The river"}).json()
    assert ids["tokens"] == tokenizer("The river").input_ids and ids["max_model_len"] == 256
    text = httpx.post(f"{tiny_server}/detokenize", json={"tokens": ids["tokens"]}).json()
    assert text["prompt"] == "The river"
