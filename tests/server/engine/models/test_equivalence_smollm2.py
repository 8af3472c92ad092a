"""The bundled real model, SmolLM2-135M, against HF generate(): token for token in float32."""

import pytest

from kvpilot_server import LLM, SamplingParams

pytestmark = pytest.mark.slow
MiB = 1 << 20
LENGTHS = [1, 5, 17, 32, 48, 64, 80, 100, 128, 150, 177, 200, 230, 256, 280, 300]
MAX_TOKENS = [24, 8, 16, 30, 12, 20, 6, 28, 10, 18, 26, 14, 22, 9, 16, 20]


@pytest.fixture(scope="module")
def workload(corpus_ids):
    prompts = [corpus_ids[(31 * i) % 400 : (31 * i) % 400 + n] for i, n in enumerate(LENGTHS)]
    return prompts, [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]


def _assert_matches_hf(llm, smollm2, workload, hf_greedy):
    prompts, params = workload
    outputs = llm.generate(prompts, params)
    for prompt, p, out in zip(prompts, params, outputs, strict=True):
        expected = hf_greedy(smollm2, prompt, p.max_tokens)
        assert out.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
    stats = llm.engine.stats()
    assert stats.kv_cache_usage == 0.0 and not llm.engine.has_unfinished_requests()


def test_chat_answers_paris_like_hf(smollm2, hf_greedy):
    llm = LLM(kv_cache_bytes=64 * MiB, max_model_len=1024, dtype="float32")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, SamplingParams(max_tokens=30, temperature=0.0))[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].token_ids == hf_greedy(smollm2, out.prompt_token_ids, 30)


@pytest.mark.parametrize(
    "engine_args",
    [
        pytest.param({}, id="block16"),
        pytest.param({"block_size": 1}, id="block1"),
        pytest.param({"block_size": 32}, id="block32"),
        pytest.param({"max_num_batched_tokens": 48}, id="chunked-prefill"),
        # 544 tokens of cache for ~2,600 tokens of work: forced preemption.
        pytest.param({"kv_cache_bytes": 24 * MiB, "max_model_len": 512}, id="preemption"),
        # The corpus repeats itself: prompt lookup finds drafts the model accepts.
        pytest.param(
            {"speculative": "ngram", "speculative_disable_by_batch_size": 16}, id="speculative"
        ),
    ],
)
def test_sixteen_concurrent_requests_match_hf(smollm2, workload, hf_greedy, engine_args):
    args = {"kv_cache_bytes": 128 * MiB, "max_model_len": 1024, **engine_args}
    llm = LLM(**args, dtype="float32")
    _assert_matches_hf(llm, smollm2, workload, hf_greedy)
    if "kv_cache_bytes" in engine_args:
        assert llm.engine.scheduler.num_preemptions > 0
    if "speculative" in engine_args:
        assert llm.engine.stats().speculation.accepted_tokens > 0


def test_shared_system_prompt_hits_prefix_cache(smollm2, corpus_ids, hf_greedy):
    llm = LLM(kv_cache_bytes=128 * MiB, max_model_len=1024, dtype="float32")
    system = [{"role": "system", "content": "You are a careful geography tutor. " * 16}]
    questions = ["Where is Peru?", "Name a river in Asia.", "What is a glacier?", "Is Oslo cold?"]
    chats = [[*system, {"role": "user", "content": q}] for q in questions]
    first = llm.chat(chats[0], SamplingParams(max_tokens=12, temperature=0.0))[0]
    rest = llm.chat(chats[1:], SamplingParams(max_tokens=12, temperature=0.0))
    for out in [first, *rest]:
        assert out.outputs[0].token_ids == hf_greedy(smollm2, out.prompt_token_ids, 12)
    assert all(out.num_cached_tokens >= 96 for out in rest)
    assert first.num_cached_tokens == 0
