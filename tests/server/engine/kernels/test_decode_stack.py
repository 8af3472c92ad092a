"""The compiled decode stack (engine/kernels/decode_stack.py) against the modules' loop it replaces:
the same kernels in the same order, so the same logprobs bit for bit, whatever the batch."""

import sys

import pytest
import torch.nn.functional as F

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.kernels import cpu_kernels, decode_stack
from kvpilot_server.engine.layers import linear
from kvpilot_server.engine.layers.half_matrices import HalfLinear
from kvpilot_server.engine.layers.quant import KERNEL_MAX_ROWS

MiB = 1 << 20


def _run(path, prompts, quantization: str, stack: bool, **engine):
    # float32 unless asked: dtype auto is bfloat16 matrices on a CPU with AMX, which no stack runs.
    engine.setdefault("dtype", "float32")
    llm = LLM(str(path), quantization=quantization, kv_cache_bytes=32 * MiB, **engine)
    if not stack:
        llm.engine.model.stack = None
    params = [
        SamplingParams(max_tokens=4 + 3 * i, temperature=0.0, logprobs=3)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


def _measured(monkeypatch, small: str, batch: str) -> None:
    """layers/linear.py's measured float32 choices, set: the stack and the modules both follow
    them, so a test needs not depend on which product won on this machine."""
    kernel = cpu_kernels.load()
    products = {"kernel": kernel.float32_linear, "gemm": kernel.float32_gemm, "linear": F.linear}
    monkeypatch.setattr(linear, "decode_product", lambda: (small, products[small]))
    monkeypatch.setattr(linear, "batch_product", lambda: (batch, products[batch]))
    # MKL for larger batches: the stack's bound stays at BATCH_MAX_ROWS, which the tests cross.
    monkeypatch.setattr(linear, "large_product", lambda: ("linear", F.linear))


@pytest.mark.parametrize(
    "name, quantization, max_rows",
    [
        ("llama-mqa-bias", "int4", KERNEL_MAX_ROWS),  # biases on every projection, one KV head
        ("mistral-window", "int4", KERNEL_MAX_ROWS),  # a sliding window shorter than the outputs
        ("qwen2", "int8", KERNEL_MAX_ROWS),  # qkv bias, int8 weights
        ("llama-odd-width", "int4", KERNEL_MAX_ROWS),  # 96 inputs: int4 against float inputs
        # float32 weights: float32_linear for a few rows, float32_gemm's tiles up to 64 rows
        ("llama-mqa-bias", "none", linear.BATCH_MAX_ROWS),
        ("mistral-window", "none", linear.BATCH_MAX_ROWS),
        ("llama-odd-width", "none", linear.BATCH_MAX_ROWS),
    ],
)
def test_the_stack_equals_the_modules_bit_for_bit(
    tiny_dir, corpus_ids, monkeypatch, name, quantization, max_rows
):
    _measured(monkeypatch, "kernel", "gemm")
    served = []
    real = decode_stack.decode_group

    def counting(metas, rows, caches, most):
        group = real(metas, rows, caches, most)
        served.append((rows, group is not None))
        return group

    monkeypatch.setattr(decode_stack, "decode_group", counting)
    path = tiny_dir(name)
    # Steps of more rows than the products serve, then fewer as short ones end.
    prompts = [corpus_ids[7 * i : 7 * i + 5 + 9 * i % 150] for i in range(max_rows + 4)]
    llm, with_stack = _run(path, prompts, quantization, stack=True, max_num_seqs=max_rows + 4)
    assert llm.engine.model.stack.max_rows == max_rows
    assert any(rows > max_rows and not used for rows, used in served)
    assert any(rows == max_rows and used for rows, used in served)
    assert any(4 < rows <= KERNEL_MAX_ROWS and used for rows, used in served)  # past silu's
    assert any(rows == 1 and used for rows, used in served)
    _, without = _run(path, prompts, quantization, stack=False, max_num_seqs=max_rows + 4)
    assert with_stack == without


def test_what_the_stack_does_not_serve_runs_the_modules(tiny_dir, corpus_ids, monkeypatch):
    prompts = [corpus_ids[:30], corpus_ids[40:50]]
    # q/k norms, and an int8 KV cache: no stack, or no step for it.
    assert _run(tiny_dir("qwen3"), prompts, "int4", stack=True)[0].engine.model.stack is None
    llm, int8_cache = _run(tiny_dir("llama"), prompts, "int4", True, kv_cache_dtype="int8")
    assert llm.engine.model.stack is not None
    assert int8_cache == _run(tiny_dir("llama"), prompts, "int4", False, kv_cache_dtype="int8")[1]


def test_bfloat16_matrices_run_in_the_stack_where_onednn_packs_them(
    tiny_dir, corpus_ids, monkeypatch
):
    """dtype bfloat16 on CPU: the stack calls oneDNN's packed product as the modules do, at
    every batch size; on a CPU without bfloat16 products oneDNN packs nothing, and the modules
    serve alone."""
    served = []
    real = decode_stack.decode_group
    monkeypatch.setattr(
        decode_stack,
        "decode_group",
        lambda *args: served.append(real(*args) is not None) or real(*args),
    )
    path = tiny_dir("llama-mqa-bias")  # biases on every projection
    prompts = [corpus_ids[7 * i : 7 * i + 5 + 9 * i % 150] for i in range(6)]
    llm, with_stack = _run(path, prompts, "none", stack=True, dtype="bfloat16")
    packed = {m.packed for m in llm.engine.model.modules() if isinstance(m, HalfLinear)}
    assert len(packed) == 1
    if packed == {False}:
        assert llm.engine.model.stack is None and not any(served)
        return
    assert llm.engine.model.stack.max_rows == sys.maxsize
    assert served.count(True) >= 10
    _, without = _run(path, prompts, "none", stack=False, dtype="bfloat16")
    assert with_stack == without


def test_float32_weights_follow_the_measured_products(tiny_dir, corpus_ids, monkeypatch):
    """The stack runs float32 weights only as far as linear() would run the compiled products:
    none where MKL won the one-row measurement, a few rows where it won the batch one."""
    prompts = [corpus_ids[:30], corpus_ids[40:50]]
    _measured(monkeypatch, "linear", "gemm")
    assert _run(tiny_dir("llama"), prompts, "none", stack=True)[0].engine.model.stack is None
    _measured(monkeypatch, "kernel", "linear")
    stack = _run(tiny_dir("llama"), prompts, "none", stack=True)[0].engine.model.stack
    assert stack.max_rows == linear.DECODE_MAX_ROWS
