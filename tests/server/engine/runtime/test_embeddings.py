"""Embedding models in the engine: vectors equal transformers' own hidden states pooled the same
way (cosine >= 0.99999), whatever else shares the batch, through chunked prefill and preemption."""

import pytest
import torch

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.runtime.sequence import Priority
from kvpilot_server.pooling_params import PoolingParams
from kvpilot_testing.embedding import make_embedding_model

MiB = 1 << 20
CLOSE = 0.99999


@pytest.fixture(scope="module")
def embedders(tiny_dir, tmp_path_factory):
    """mode -> an embedding checkpoint pooling that way (last: Qwen3, as Qwen3-Embedding)."""
    root = tmp_path_factory.mktemp("embedders")
    return {
        "last": make_embedding_model(tiny_dir("qwen3"), root / "last", "last", matryoshka=True),
        "mean": make_embedding_model(tiny_dir("llama"), root / "mean", "mean"),
        "cls": make_embedding_model(tiny_dir("llama"), root / "cls", "cls", normalize=False),
    }


def _reference(path, prompts: list[list[int]], mode: str, normalize: bool) -> list[torch.Tensor]:
    """transformers' base model, one prompt at a time: last_hidden_state pooled by `mode`."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    vectors = []
    for prompt in prompts:
        with torch.inference_mode():
            hidden = model(torch.tensor([prompt])).last_hidden_state[0]
        vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[mode]
        vectors.append(torch.nn.functional.normalize(vector, dim=-1) if normalize else vector)
    return vectors


def _cosines(outputs, reference) -> list[float]:
    got = [torch.tensor(o.embedding) for o in outputs]
    pairs = zip(got, reference, strict=True)
    return [torch.nn.functional.cosine_similarity(g, r, dim=0).item() for g, r in pairs]


@pytest.mark.parametrize("mode", ["last", "mean", "cls"])
def test_vectors_equal_transformers_pooled_alike(mode, embedders, corpus_ids):
    path = embedders[mode]
    # Chunks of 24 tokens: the longer inputs are pooled across several steps.
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, max_num_batched_tokens=24, dtype="float32")
    assert llm.engine.task == "embed"
    prompts = [corpus_ids[s : s + n] for s, n in ((0, 1), (40, 23), (90, 100), (300, 57))]
    outputs = llm.embed(prompts)
    reference = _reference(path, prompts, mode, normalize=mode != "cls")
    assert min(_cosines(outputs, reference)) >= CLOSE
    if mode == "cls":  # not normalized: the length is the model's own
        assert abs(torch.tensor(outputs[2].embedding).norm() - reference[2].norm()) < 1e-3
    assert all(o.outputs[0].token_ids == [] for o in outputs)
    assert llm.engine.pool.usage() == 0  # prefill only: nothing kept after


def test_a_vector_does_not_depend_on_its_batch(embedders, corpus_ids):
    llm = LLM(
        str(embedders["mean"]), kv_cache_bytes=16 * MiB, max_num_batched_tokens=64, dtype="float32"
    )
    target = corpus_ids[100:180]
    alone = llm.embed([target])[0].embedding
    crowd = [corpus_ids[s : s + 70] for s in range(0, 700, 70)]
    together = llm.embed([*crowd[:5], target, *crowd[5:]])[5].embedding
    cosine = torch.nn.functional.cosine_similarity(
        torch.tensor(alone), torch.tensor(together), dim=0
    )
    assert cosine.item() >= CLOSE


def test_preempted_inputs_are_pooled_once(embedders, corpus_ids):
    """A KV cache for about one input at a time: a batch-class input, halfway through its
    prefill, is preempted by an interactive one and recomputed from the start; the rows computed
    again are not added to the mean twice."""
    path = embedders["mean"]
    per_token = 2 * 2 * 2 * 16 * 4  # K and V, layers, kv heads, head_dim, float32
    llm = LLM(
        str(path),
        kv_cache_bytes=per_token * 160,
        max_model_len=150,
        max_num_batched_tokens=100,
        dtype="float32",
    )
    engine, prompts = llm.engine, [corpus_ids[0:140], corpus_ids[150:290]]
    engine.add_request("batch", prompts[0], PoolingParams(), Priority.BATCH)
    assert engine.step() == []  # 100 of its 140 tokens computed and pooled
    engine.add_request("interactive", prompts[1], PoolingParams())
    done = {}
    for _ in range(20):  # bounded: four steps suffice
        done.update((o.request_id, o) for o in engine.step() if o.finished)
        if len(done) == 2:
            break
    assert engine.scheduler.num_preemptions == 1
    outputs = [done["batch"], done["interactive"]]
    assert min(_cosines(outputs, _reference(path, prompts, "mean", True))) >= CLOSE


def test_matryoshka_dimensions_truncate_then_normalize(embedders, corpus_ids):
    llm = LLM(str(embedders["last"]), kv_cache_bytes=16 * MiB, dtype="float32")
    prompt = corpus_ids[:30]
    full = torch.tensor(llm.embed([prompt])[0].embedding)
    short = torch.tensor(llm.embed([prompt], PoolingParams(dimensions=16))[0].embedding)
    assert short.shape == (16,)
    expected = torch.nn.functional.normalize(full[:16], dim=-1)  # the full one is unit length
    assert torch.allclose(short, expected, atol=1e-5)
    with pytest.raises(InvalidRequestError, match="dimensions must be one of 16, 32, 64"):
        llm.embed([prompt], PoolingParams(dimensions=20))


def test_each_task_refuses_the_other(embedders, tiny_dir, corpus_ids):
    embedder = LLM(str(embedders["mean"]), kv_cache_bytes=16 * MiB, dtype="float32")
    with pytest.raises(InvalidRequestError, match="serves embed requests, not generate"):
        embedder.generate([corpus_ids[:5]], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="not trained for shortened embeddings"):
        embedder.embed([corpus_ids[:5]], PoolingParams(dimensions=8))
    generator = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB, dtype="float32")
    assert generator.engine.task == "generate"
    with pytest.raises(InvalidRequestError, match="serves generate requests, not embed"):
        generator.embed([corpus_ids[:5]])
    forced = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB, task="embed", dtype="float32")
    vector = forced.embed([corpus_ids[:9]])[0].embedding  # no sentence-transformers config
    assert abs(torch.tensor(vector).norm().item() - 1.0) < 1e-5  # last token, normalized
