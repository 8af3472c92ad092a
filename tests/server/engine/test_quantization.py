"""int8 weight-only quantization: the kernel equals its dequantized reference, each quantized
linear stays within 1% of its float version, SmolLM2 still answers and agrees with float32 on
>= 90% of next tokens, and formats not built yet fail at start with a clear message."""

import pytest
import torch
from torch import nn

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine import cpu_kernels
from kvpilot_server.engine.quant import KERNEL_MAX_ROWS, Int8Linear, quantize_int8
from kvpilot_server.errors import ConfigError

SHAPES = [(1536, 576, True), (576, 1536, False), (100, 37, True)]  # 37: not a multiple of 16


@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 5])
def test_int8_linear_matches_dequantized_and_float(out_features, in_features, bias, rows):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    quantized = Int8Linear(linear)
    x = torch.randn(rows, in_features)
    q, scale = quantize_int8(linear.weight)
    reference = nn.functional.linear(x, q.float() * scale[:, None], linear.bias)
    got = quantized(x)
    assert torch.allclose(got, reference, rtol=1e-5, atol=1e-5)  # the kernel is exact arithmetic
    with torch.no_grad():
        exact = linear(x)
    relative = ((got - exact).norm() / exact.norm()).item()
    assert relative < 0.01  # stated tolerance for per-channel int8 weights


def test_the_kernel_builds_on_this_machine():
    assert cpu_kernels.load_int8() is not None  # otherwise int8 silently runs the slow path


@pytest.mark.slow
def test_smollm2_int8_answers_and_agrees_with_float32(smollm2, corpus_ids):
    prompts = [corpus_ids[i * 40 : i * 40 + 60] for i in range(8)]
    greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    reference = LLM(str(smollm2), max_model_len=512, kv_cache_bytes=64 << 20)
    expected = [o.outputs[0].token_ids for o in reference.generate(prompts, greedy)]
    del reference
    llm = LLM(str(smollm2), max_model_len=512, kv_cache_bytes=64 << 20, quantization="int8")
    answer = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=20, temperature=0.0),
    )
    assert "Paris" in answer[0].outputs[0].text
    # Teacher-forced: int8's next token after each prefix of float32's own greedy output.
    contexts = [p + e[:t] for p, e in zip(prompts, expected, strict=True) for t in range(32)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    predicted = [o.outputs[0].token_ids[0] for o in llm.generate(contexts, one)]
    truth = [token for e in expected for token in e]
    agreement = sum(a == b for a, b in zip(predicted, truth, strict=True)) / len(truth)
    print({"int8_teacher_forced_greedy_agreement": agreement})
    assert agreement >= 0.9  # the bar


@pytest.mark.parametrize("method", ["int4", "fp8"])
def test_formats_not_built_yet_fail_at_start(method):
    with pytest.raises(ConfigError, match=f"quantization '{method}' is not supported"):
        EngineConfig(quantization=method)
