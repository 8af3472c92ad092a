"""The compiled decode stack (engine/kernels/decode_stack.py) against the modules' loop it replaces:
the same kernels in the same order, so the same logprobs bit for bit, whatever the batch."""

import pytest

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.kernels import decode_stack
from kvpilot_server.engine.layers.quant import KERNEL_MAX_ROWS

MiB = 1 << 20


def _run(path, prompts, quantization: str, stack: bool, **engine):
    llm = LLM(str(path), quantization=quantization, kv_cache_bytes=32 * MiB, **engine)
    if not stack:
        llm.engine.model.stack = None
    params = [
        SamplingParams(max_tokens=4 + 3 * i, temperature=0.0, logprobs=3)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


@pytest.mark.parametrize(
    "name, quantization",
    [
        ("llama-mqa-bias", "int4"),  # biases on every projection, one KV head
        ("mistral-window", "int4"),  # a sliding window shorter than the outputs
        ("qwen2", "int8"),  # qkv bias, int8 weights
        ("llama-odd-width", "int4"),  # 96 inputs: int4 against float activations
    ],
)
def test_the_stack_equals_the_modules_bit_for_bit(
    tiny_dir, corpus_ids, monkeypatch, name, quantization
):
    served = []
    real = decode_stack.decode_group

    def counting(metas, rows, caches):
        group = real(metas, rows, caches)
        served.append((rows, group is not None))
        return group

    monkeypatch.setattr(decode_stack, "decode_group", counting)
    path = tiny_dir(name)
    # 20 sequences: steps of more rows than the kernels serve, then fewer as short ones end.
    prompts = [corpus_ids[7 * i : 7 * i + 5 + 9 * i] for i in range(KERNEL_MAX_ROWS + 4)]
    llm, with_stack = _run(path, prompts, quantization, stack=True)
    assert llm.engine.model.stack is not None
    assert any(rows > KERNEL_MAX_ROWS and not used for rows, used in served)
    assert any(rows > 4 and used for rows, used in served)  # past the compiled silu's rows
    assert any(rows == 1 and used for rows, used in served)
    _, without = _run(path, prompts, quantization, stack=False)
    assert with_stack == without


def test_what_the_stack_does_not_serve_runs_the_modules(tiny_dir, corpus_ids):
    prompts = [corpus_ids[:30], corpus_ids[40:50]]
    # Float weights, q/k norms, and an int8 KV cache: no stack, or no step for it.
    assert _run(tiny_dir("llama"), prompts, "none", stack=True)[0].engine.model.stack is None
    assert _run(tiny_dir("qwen3"), prompts, "int4", stack=True)[0].engine.model.stack is None
    llm, int8_cache = _run(tiny_dir("llama"), prompts, "int4", True, kv_cache_dtype="int8")
    assert llm.engine.model.stack is not None
    assert int8_cache == _run(tiny_dir("llama"), prompts, "int4", False, kv_cache_dtype="int8")[1]
