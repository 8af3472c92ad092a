"""Constrained decoding on a tiny random model: whatever the sampling mode, every sample that
finishes with `stop` matches its constraint. A random model is the hard case: it has no wish
to write JSON, so only the masks make it."""

import dataclasses
import json
import re
import time

import jsonschema
import pytest

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.sampling_params import StructuredOutputsParams
from kvpilot_testing.corpus import CORPUS
from kvpilot_testing.schemas import SCHEMAS

MiB = 1 << 20
PER_SCHEMA = 52  # x 20 schemas: over 1,000 samples


def _modes(seed: int) -> list[dict]:
    """Every sampling mode the sampler has, one after another."""
    return [
        {"temperature": 1.0, "seed": seed},
        {"temperature": 0.7, "top_p": 0.9, "seed": seed},
        {"temperature": 1.2, "top_k": 20, "seed": seed},
        {"temperature": 1.0, "min_p": 0.05, "repetition_penalty": 1.3, "seed": seed},
        {"temperature": 0.8, "presence_penalty": 1.0, "frequency_penalty": 0.5, "logprobs": 2},
        {"temperature": 0.0},
    ]


@pytest.fixture(scope="module")
def ids(llm) -> list[int]:
    return llm.tokenizer(CORPUS).input_ids


@pytest.fixture(scope="module")
def llm(small_vocab_dir) -> LLM:
    return LLM(str(small_vocab_dir("llama")), kv_cache_bytes=16 * MiB, dtype="float32")


def test_json_schema_samples_validate(llm, ids):
    started = time.monotonic()
    checked = finished = 0
    for schema in SCHEMAS.values():
        params = [
            SamplingParams(
                max_tokens=64,
                structured_outputs=StructuredOutputsParams(json=schema),
                **_modes(i)[i % 6],
            )
            for i in range(PER_SCHEMA)
        ]
        prompts = [ids[i : i + 8 + i % 5] for i in range(PER_SCHEMA)]
        for out in llm.generate(prompts, params, use_tqdm=False):
            completion = out.outputs[0]
            checked += 1
            if completion.finish_reason != "stop":
                assert completion.finish_reason == "length", completion
                continue
            finished += 1
            jsonschema.validate(json.loads(completion.text), schema)
    print(f"{checked} samples, {finished} finished, {time.monotonic() - started:.1f} s")
    assert checked >= 1000
    assert finished >= 0.7 * checked  # the test checks real answers, not only truncated ones


def test_regex_and_choice_samples_match(llm, ids):
    patterns = [
        r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)",
        r"-?[0-9]{1,4}",
        r"(yes|no)( because [a-z]{1,8})?",
    ]
    choices = ["alpha", "beta", "gamma delta", "ε"]
    for pattern in patterns:
        spec = StructuredOutputsParams(regex=pattern)
        params = [SamplingParams(max_tokens=24, seed=i, structured_outputs=spec) for i in range(40)]
        outs = llm.generate([ids[i : i + 9] for i in range(40)], params, use_tqdm=False)
        texts = [o.outputs[0].text for o in outs if o.outputs[0].finish_reason == "stop"]
        assert len(texts) >= 30, texts
        assert [t for t in texts if not re.fullmatch(pattern, t)] == []
    spec = StructuredOutputsParams(choice=choices)
    params = [SamplingParams(max_tokens=16, seed=i, structured_outputs=spec) for i in range(40)]
    outs = llm.generate([ids[i : i + 9] for i in range(40)], params, use_tqdm=False)
    assert all(o.outputs[0].text in choices for o in outs), [o.outputs[0] for o in outs]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_preemption_and_chunked_prefill_change_no_constrained_token(small_vocab_dir, ids):
    """A preempted sequence keeps its tokens and so its grammar state: greedy constrained
    outputs under a KV cache too small for the batch, with prompts prefilled in chunks, equal
    those of an engine with room for everything."""
    path = str(small_vocab_dir("llama"))
    schemas = list(SCHEMAS.values())[:12]
    prompts = [ids[i * 7 : i * 7 + 40 + i] for i in range(len(schemas))]
    params = [
        SamplingParams(
            max_tokens=48, temperature=0.0, structured_outputs=StructuredOutputsParams(json=s)
        )
        for s in schemas
    ]
    roomy = LLM(path, kv_cache_bytes=16 * MiB, dtype="float32")
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    # Room for about 300 tokens of 12 x ~85: sequences preempt each other; 24-token chunks.
    cramped = LLM(
        path,
        kv_cache_bytes=_bytes_for(path, 320),
        max_model_len=256,
        max_num_batched_tokens=24,
        dtype="float32",
    )
    fresh = [
        dataclasses.replace(p, structured_outputs=StructuredOutputsParams(json=s))
        for p, s in zip(params, schemas, strict=True)
    ]
    got = [o.outputs[0].token_ids for o in cramped.generate(prompts, fresh, use_tqdm=False)]
    assert cramped.engine.scheduler.num_preemptions > 0
    assert got == expected


def _bytes_for(path: str, tokens: int) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4 * tokens


def test_logprobs_are_those_of_the_constrained_distribution(llm, ids):
    """As vLLM: logprobs come after the mask, so every alternative reported is one the
    constraint allows (the others have probability 0)."""
    spec = StructuredOutputsParams(regex="[0-9]{3}")
    params = SamplingParams(
        max_tokens=8, temperature=1.0, seed=1, logprobs=5, structured_outputs=spec
    )
    out = llm.generate([ids[:12]], params, use_tqdm=False)[0].outputs[0]
    assert re.fullmatch("[0-9]{3}", out.text)
    for sample in out.logprobs:
        assert sample.logprob > float("-inf")
        finite = [t for t, logprob in sample.top_logprobs if logprob > float("-inf")]
        assert finite and all(llm.tokenizer.decode([t]).isdigit() for t in finite)
