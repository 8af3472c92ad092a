"""POST /v1/embeddings through the official openai client against a live `kvpilot serve` of a
tiny embedding checkpoint: every input shape OpenAI defines, float and base64, `dimensions`,
usage, and the 400s (the wrong task, bad inputs) in OpenAI's error shape."""

import base64
import struct

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer

from kvpilot_testing.embedding import make_embedding_model


@pytest.fixture(scope="module")
def embedder(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("embedder")
    return make_embedding_model(tiny_dir("qwen3"), root / "last", "last", matryoshka=True)


@pytest.fixture(scope="module")
def embed_server(server_pool, embedder):
    with server_pool.private_tiny(embedder, name="embedder") as server:  # this module's model
        yield server.base


@pytest.fixture(scope="module")
def embed_client(embed_server):
    return openai.OpenAI(base_url=f"{embed_server}/v1", api_key="-", max_retries=0, timeout=60)


def _floats(embedding: list[float] | str) -> list[float]:
    if isinstance(embedding, list):
        return embedding
    packed = base64.b64decode(embedding)
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))


def _reference(path, texts: list[str]) -> list[torch.Tensor]:
    from transformers import AutoModel

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    found = []
    for text in texts:
        with torch.inference_mode():
            hidden = model(tokenizer(text, return_tensors="pt").input_ids).last_hidden_state
        found.append(torch.nn.functional.normalize(hidden[0, -1], dim=-1))
    return found


def test_texts_embed_as_transformers_pools_them(embed_client, embedder):
    texts = ["Rivers carry water to the sea.", "a", "The quick brown fox " * 12]
    # No encoding_format: the SDK asks for base64 and decodes it; asked for, base64 stays text.
    for encoding in ({}, {"encoding_format": "float"}, {"encoding_format": "base64"}):
        out = embed_client.embeddings.create(model="embedder", input=texts, **encoding)
        assert [d.index for d in out.data] == [0, 1, 2]
        got = [torch.tensor(_floats(d.embedding)) for d in out.data]
        for vector, expected in zip(got, _reference(embedder, texts), strict=True):
            assert torch.nn.functional.cosine_similarity(vector, expected, dim=0) >= 0.99999
    tokenizer = AutoTokenizer.from_pretrained(embedder)
    counted = sum(len(tokenizer(t).input_ids) for t in texts)
    assert out.usage.prompt_tokens == out.usage.total_tokens == counted
    assert out.model == "embedder"


def test_token_ids_and_a_single_string_are_inputs_too(embed_client, embedder):
    tokenizer = AutoTokenizer.from_pretrained(embedder)
    text = "Embeddings for retrieval"
    ids = tokenizer(text).input_ids
    one = embed_client.embeddings.create(model="embedder", input=text).data[0].embedding
    by_ids = embed_client.embeddings.create(model="embedder", input=ids).data[0].embedding
    nested = embed_client.embeddings.create(model="embedder", input=[ids, ids]).data
    # Float32's last bits differ between a batch of one and of two (other kernel blockings):
    # the same vector to within 1e-5 of a unit length, not bit for bit.
    assert torch.allclose(torch.tensor(one), torch.tensor(by_ids), atol=1e-5)
    assert len(nested) == 2
    assert torch.allclose(torch.tensor(nested[1].embedding), torch.tensor(one), atol=1e-5)


def test_dimensions_shorten_the_vector(embed_client):
    full = embed_client.embeddings.create(model="embedder", input="short").data[0].embedding
    short = embed_client.embeddings.create(model="embedder", input="short", dimensions=32)
    vector = torch.tensor(short.data[0].embedding)
    assert vector.shape == (32,)
    assert torch.allclose(vector, torch.nn.functional.normalize(torch.tensor(full[:32]), dim=0))
    with pytest.raises(openai.BadRequestError) as refused:
        embed_client.embeddings.create(model="embedder", input="short", dimensions=20)
    assert refused.value.body["param"] == "dimensions"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [1, -2]}, "input"),
        ({"input": [[1, 2], [999999]]}, "input.1"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
        ({"input": "word " * 2000}, "input"),
    ],
)
def test_bad_inputs_are_400s_naming_the_field(embed_server, body, param):
    answer = httpx.post(f"{embed_server}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] is None or error["param"].startswith(param), error


def test_an_embedding_model_refuses_generation_and_says_its_task(embed_client, embed_server):
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        embed_client.chat.completions.create(
            model="embedder", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        embed_client.completions.create(model="embedder", prompt="hi", max_tokens=3)
    cards = httpx.get(f"{embed_server}/v1/models").json()["data"]
    assert [(c["id"], c["task"]) for c in cards] == [("embedder", "embed")]


def test_a_generation_model_refuses_embeddings(client, tiny_server):
    with pytest.raises(openai.BadRequestError, match="generates text"):
        client.embeddings.create(model="tiny", input="hi")
    cards = httpx.get(f"{tiny_server}/v1/models").json()["data"]
    assert cards[0]["task"] == "generate"
