"""Taking over a stream through the API, with the official openai client: `return_token_ids`
(vLLM's) puts each chunk's token ids on it; a request with `kvpilot_continue` (the tokens the
client already has, the response's id and created) and the server's gateway secret goes on
from there: no second role chunk, the same id and created, and the rest of the text, so the two
streams joined are the uninterrupted one, usage included, at temperature 0.8 with a seed. Without
the secret, or for n > 1, it is a 400."""

from collections.abc import Iterator

import openai
import pytest

from kvpilot_common import trust

SECRET = "not-a-client-secret"
CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Tell me a story"}],
    "max_tokens": 24,
    "temperature": 0.8,
    "seed": 5,
    "presence_penalty": 0.4,
}
TEXT = {
    "model": "tiny",
    "prompt": "Once upon a time",
    "max_tokens": 24,
    "temperature": 0.8,
    "seed": 9,
}


@pytest.fixture(scope="module")
def client(server_pool, tiny_dir) -> Iterator[openai.OpenAI]:
    with server_pool.tiny(tiny_dir("llama"), env={trust.ENV: SECRET}) as server:
        yield openai.OpenAI(base_url=f"{server.base}/v1", api_key="-", max_retries=0, timeout=60)


def _stream(create, body: dict, **extra) -> list:
    return list(create(**body, stream=True, stream_options={"include_usage": True}, **extra))


def _text(chunk) -> str:
    choice = chunk.choices[0]
    return (choice.delta.content or "") if hasattr(choice, "delta") else choice.text


def _ids(chunks: list) -> list[int]:
    return [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "text"])
def test_a_stream_taken_over_midway_joins_into_the_uninterrupted_one(client, chat):
    create = client.chat.completions.create if chat else client.completions.create
    body = CHAT if chat else TEXT
    whole = _stream(create, body, extra_body={"return_token_ids": True})
    with_text = [c for c in whole if c.choices]
    full_text, full_ids = "".join(map(_text, with_text)), _ids(with_text)
    assert len(full_ids) == whole[-1].usage.completion_tokens == 24
    if chat:
        assert with_text[0].choices[0].delta.role == "assistant"
        assert len(with_text[0].model_extra["prompt_token_ids"]) == whole[-1].usage.prompt_tokens
    for cut in (2, len(with_text) // 2):
        sent = with_text[:cut]
        resumed = {"token_ids": _ids(sent), "id": whole[0].id, "created": whole[0].created}
        rest = _stream(
            create,
            body,
            extra_body={"return_token_ids": True, "kvpilot_continue": resumed},
            extra_headers={trust.HEADER: SECRET},
        )
        assert {(c.id, c.created) for c in rest} == {(whole[0].id, whole[0].created)}
        if chat:
            assert all(c.choices[0].delta.role is None for c in rest if c.choices)
        more = [c for c in rest if c.choices]
        assert "".join(map(_text, sent + more)) == full_text
        assert _ids(sent) + _ids(more) == full_ids
        assert rest[-1].usage.completion_tokens == whole[-1].usage.completion_tokens
        assert rest[-1].usage.prompt_tokens == whole[-1].usage.prompt_tokens


def test_an_answer_carries_its_token_ids_when_asked(client):
    answer = client.chat.completions.create(**CHAT, extra_body={"return_token_ids": True})
    assert len(answer.choices[0].model_extra["token_ids"]) == answer.usage.completion_tokens
    assert len(answer.model_extra["prompt_token_ids"]) == answer.usage.prompt_tokens
    plain = client.chat.completions.create(**CHAT)
    assert "token_ids" not in (plain.choices[0].model_extra or {})
    assert plain.choices[0].message.content == answer.choices[0].message.content


@pytest.mark.parametrize(
    ("headers", "extra", "param"),
    [
        ({}, {}, "kvpilot_continue"),
        ({trust.HEADER: "guess"}, {}, "kvpilot_continue"),
        ({trust.HEADER: SECRET}, {"n": 2}, "n"),
    ],
)
def test_a_continuation_without_the_secret_or_for_several_choices_is_refused(
    client, headers, extra, param
):
    resumed = {"token_ids": [5, 6], "id": "chatcmpl-x", "created": 1}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            **CHAT, **extra, extra_body={"kvpilot_continue": resumed}, extra_headers=headers
        )
    assert refused.value.body["param"] == param
