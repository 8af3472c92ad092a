"""Tensor parallelism on CPU: two ranks, two processes, real torch.distributed over gloo.

Greedy output must equal Hugging Face generate() in float32 token for token, through chunked
prefill, prefix-cache hits and preemption; int8 weights at two ranks must agree with int8 at one.
"""

import random

import pytest
from transformers import AutoConfig

from kvpilot_common import parallelism
from kvpilot_common.errors import ConfigError
from kvpilot_server import LLM, SamplingParams

MiB = 1 << 20


def _per_rank_bytes(path, tokens: int, ranks: int) -> int:
    """KV bytes one rank needs for `tokens` tokens in float32 (its share of the KV heads)."""
    cfg = AutoConfig.from_pretrained(path)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = parallelism.kv_heads_per_rank(cfg.num_key_value_heads, ranks)
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * tokens


@pytest.fixture
def open_engines():
    """LLMs made in a test, their worker processes stopped afterwards however it ends."""
    engines: list[LLM] = []
    yield engines
    for llm in engines:
        llm.engine.close()


@pytest.mark.parametrize(
    "name",
    [
        "llama-mqa-bias",
        "qwen3",
        "mistral-window",
        "qwen2-moe",
        "mixtral",
        "phi3",
        "gemma3",
        "gpt-oss",
    ],
)
def test_two_ranks_match_hf(name, tiny_dir, corpus_ids, hf_greedy, open_engines):
    """llama-mqa-bias: one KV head (fewer than the ranks: replicated) and random biases on every
    projection; qwen3: q/k norms, tied embeddings; mistral-window: sliding-window attention;
    qwen2-moe and mixtral: every rank a slice of every expert (and of the shared expert); phi3:
    q/k/v and gate/up stored fused, cut into their parts before each part is sharded; gemma3:
    Gemma's norms (q/k ones too) replicated, alternating windows and ropes; gpt-oss: each rank
    its heads' sinks, its slice of every expert's gate and up biases, the down biases and the
    router's bias counted once."""
    path = tiny_dir(name)
    llm = LLM(
        str(path),
        tensor_parallel_size=2,
        max_num_batched_tokens=24,  # every prompt is prefilled in chunks
        kv_cache_bytes=_per_rank_bytes(path, 320, 2),  # about two sequences at a time
        max_model_len=320,
        dtype="float32",
    )
    open_engines.append(llm)
    engine = llm.engine
    assert len(engine.workers.procs) == 1 and engine.model.cfg.num_heads == 2
    rng = random.Random(3)
    system = corpus_ids[:64]  # shared by every prompt: four full blocks to hit
    tails = [corpus_ids[(s := rng.randrange(100, 900)) : s + n] for n in (40, 70, 25, 90, 55)]
    prompts = [system + tail for tail in tails]
    lengths = [30, 45, 20, 50, 35]
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in lengths]
    first = llm.generate(prompts[:1], params[:1])  # fills the prefix cache
    rest = llm.generate(prompts[1:], params[1:])
    for prompt, out, m in zip(prompts, first + rest, lengths, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(path, prompt, m), f"prompt len {len(prompt)}"
    assert engine.pool.num_hits >= 4 * 64
    assert engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("name", ["llama", "qwen3-moe"])
def test_int8_at_two_ranks_agrees_with_one(name, tiny_dir, corpus_ids, open_engines):
    """Each rank quantizes its own slices: column-parallel rows keep their scales, row-parallel
    ones (the experts' down projections too) get the whole row's scale; greedy tokens agree
    with the single-process model."""
    path = tiny_dir(name)
    prompts = [corpus_ids[s : s + n] for s, n in ((0, 30), (200, 75), (500, 12))]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outputs = []
    for ranks in (1, 2):
        llm = LLM(
            str(path),
            quantization="int8",
            tensor_parallel_size=ranks,
            kv_cache_bytes=MiB,
            dtype="float32",
        )
        open_engines.append(llm)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert open_engines[1].engine.workers is not None
    assert outputs[0] == outputs[1]


def test_a_size_that_does_not_divide_the_heads_is_refused_before_any_worker(tiny_dir):
    with pytest.raises(ConfigError, match="does not divide the model's 4 attention heads"):
        LLM(str(tiny_dir("llama")), tensor_parallel_size=3, dtype="float32")


def test_every_rank_builds_the_matrices_rank_0_does(tiny_dir, open_engines, capfd):
    """dtype bfloat16 on CPU is float32 activations with bfloat16 matrices: the ranks are told
    the dtype by its name, not by the float32 tensors rank 0 keeps, so rank 1's partial sums
    come from bfloat16 products too (each rank logs what it converted, to the shared stderr)."""
    llm = LLM(
        str(tiny_dir("llama")), tensor_parallel_size=2, kv_cache_bytes=4 * MiB, dtype="bfloat16"
    )
    open_engines.append(llm)
    llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))  # both ranks built
    err = capfd.readouterr().err
    assert any("rank 1" in line and "bfloat16 matrices" in line for line in err.splitlines())
    # A clean stop is a clean exit: the worker's stdin watcher must not abort its shutdown.
    llm.engine.close()
    assert [p.returncode for p in llm.engine.workers.procs.values()] == [0]
    assert "Fatal Python error" not in capfd.readouterr().err
