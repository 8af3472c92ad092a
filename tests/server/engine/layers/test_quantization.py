"""Weight quantization: the kernels equal their dequantized references, each quantized linear stays
within a stated tolerance of its float version per format, SmolLM2 still answers and agrees with
float32, and combinations that cannot run fail at start with a clear message."""

import shutil

import pytest
import torch
from torch import nn

from kvpilot_common.errors import ConfigError
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.kernels.operands import ProductKind
from kvpilot_server.engine.layers.quant import (
    KERNEL_MAX_ROWS,
    DenseBuffer,
    Fp8Linear,
    Int4Linear,
    Int8Linear,
    dequantize_int4,
    int8_activations,
    quantize_int8,
)

SHAPES = [(1536, 576, True), (576, 1536, False), (96, 64, True)]
# Relative output error allowed per format, for nn.Linear's own initialisation: int8 per
# channel keeps 8 bits; int4 keeps 4 bits per group; fp8 e4m3 rounds weights and activations
# to 3 mantissa bits.
TOLERANCE = {"int8": 0.01, "int4": 0.08, "fp8": 0.05}
ROWS = [1, 3, 8, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 5]


def _relative(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_int8_linear_matches_dequantized_and_float(out_features, in_features, bias, rows):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(rows, in_features)
    q, scale = quantize_int8(linear.weight)
    reference = nn.functional.linear(x, q.float() * scale[:, None], linear.bias)
    got = Int8Linear(linear, DenseBuffer(torch.empty(0)))(x)
    assert torch.allclose(got, reference, rtol=1e-4, atol=1e-4)  # the kernel is exact arithmetic
    with torch.no_grad():
        assert _relative(got, linear(x)) < TOLERANCE["int8"]


def _int4_reference(x, quantized, group, bias, int8_x):
    """y = x W^T + b with W the int4 weight: the scaled part against the (quantized, on the
    kernel's path) activations, the group minimum against the exact float group sums."""
    scaled = dequantize_int4(
        quantized.weight, quantized.scale, torch.zeros_like(quantized.minimum), group
    )
    xs = int8_activations(x) if int8_x else x
    sums = x.view(x.shape[0], -1, group).sum(2)
    out = xs @ scaled.t() + sums @ quantized.minimum.float().t()
    return out if bias is None else out + bias


# 96 inputs are not whole spans of 64: the kernel that widens int4 to float serves them.
INT4_SHAPES = [(*shape, group) for shape in SHAPES for group in (32, 64)] + [(64, 96, True, 32)]


@pytest.mark.parametrize(("out_features", "in_features", "bias", "group"), INT4_SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_int4_linear_matches_its_reference_and_float(out_features, in_features, bias, group, rows):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(rows, in_features)
    x[0, 5] = 40.0  # an outlier costs precision in its own block of 32 only
    quantized = Int4Linear(linear, DenseBuffer(torch.empty(0)), group)
    span = cpu_kernels.load().INT8_ACTIVATION_SPAN
    int8_x = rows <= KERNEL_MAX_ROWS and in_features % span == 0
    reference = _int4_reference(x, quantized, group, linear.bias, int8_x)
    got = quantized(x)
    assert torch.allclose(got, reference, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        assert _relative(got, linear(x)) < TOLERANCE["int4"]


def test_int8_activations_follow_the_torch_definition():
    torch.manual_seed(0)
    x = torch.randn(5, 576) * torch.logspace(-3, 2, 576)  # blocks of very different ranges
    x[1, :32] = 0.0  # an all-zero block: scale 0, every value 0
    x[2, 7] = 0.5 * x[2, :32].abs().max()  # nothing special, a tie is rare but possible
    xq, d = cpu_kernels.load().quantize_activations(x)
    assert xq.dtype == torch.int8 and d.shape == (5, 576 // 32)
    expected = int8_activations(x)
    assert torch.equal((xq.float().view(5, -1, 32) * d[..., None]).view_as(x), expected)
    assert d[1, 0] == 0 and torch.all(xq[1, :32] == 0)


@pytest.mark.parametrize("outliers", [1.0, 30.0, 300.0])
def test_int8_activations_cost_less_than_the_int4_weights_do(outliers):
    # Per-block scales: the error the activations add stays under the 4-bit weights' own, even
    # with outliers in a third of the blocks (per-tensor int8 activations fail on those).
    torch.manual_seed(0)
    linear = nn.Linear(1536, 576)
    x = torch.randn(4, 1536)
    x[:, ::97] *= outliers
    quantized = Int4Linear(linear, DenseBuffer(torch.empty(0)), 32)
    float_activations = _int4_reference(x, quantized, 32, linear.bias, int8_x=False)
    with torch.no_grad():
        weights_error = _relative(float_activations, linear(x))
    assert _relative(quantized(x), float_activations) < weights_error
    assert weights_error < TOLERANCE["int4"]


@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES)
def test_fp8_linear_within_tolerance(out_features, in_features, bias):
    # torch's _scaled_mm runs on CPU too, so the format's arithmetic is checked here; the engine
    # itself only takes fp8 on CUDA GPUs of compute capability 8.9+.
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(5, in_features)
    with torch.no_grad():
        assert _relative(Fp8Linear(linear)(x), linear(x)) < TOLERANCE["fp8"]


def test_int4_in_groups_of_32_reproduces_the_bundled_q4_1_checkpoint(smollm2):
    # llama.cpp's Q4_1 stores blocks of 32 weights as q * scale + minimum, q in [0, 15]: the
    # same format, so a min-max int4 of those weights is exact. Not true of int8 per channel.
    from kvpilot_server.engine.models.loader import load_model

    model = load_model(smollm2, torch.float32, torch.device("cpu"))
    weight = model.layers[3].mlp.down_proj.weight.detach()
    int4 = Int4Linear(model.layers[3].mlp.down_proj, DenseBuffer(torch.empty(0)), 32)
    dense = dequantize_int4(int4.weight, int4.scale, int4.minimum, 32)
    assert torch.allclose(dense, weight, atol=1e-6)
    q, scale = quantize_int8(weight)
    assert not torch.allclose(q.float() * scale[:, None], weight, atol=1e-6)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_bfloat16_model_takes_the_expand_path_as_cuda_does(method):
    torch.manual_seed(0)
    linear = nn.Linear(576, 192).to(torch.bfloat16)
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    buffer = DenseBuffer(linear.weight)
    quantized = Int8Linear(linear, buffer) if method == "int8" else Int4Linear(linear, buffer, 32)
    assert quantized.kernel is None  # the AVX2 kernels are float32 only
    got = quantized(x)
    assert got.dtype == torch.bfloat16
    with torch.no_grad():
        assert _relative(got.float(), linear(x).float()) < TOLERANCE[method] + 0.01  # + bf16


def test_the_kernels_build_on_this_machine():
    assert cpu_kernels.load() is not None  # otherwise int8/int4 run the slow path


def test_quantized_layers_name_their_kernel_and_its_operands():
    """What the decode stack builds from: the product each layer runs few rows through (int4
    quantizes activations only over whole spans of inputs) and the tensors it stores."""
    torch.manual_seed(0)
    buffer = DenseBuffer(torch.empty(0))
    int8 = Int8Linear(nn.Linear(64, 32), buffer)
    assert int8.decode_operands() == (
        ProductKind.INT8,
        int8.weight,
        int8.scale,
        None,
        0,
        int8.bias,
        KERNEL_MAX_ROWS,
    )
    span = cpu_kernels.load().INT8_ACTIVATION_SPAN
    for inputs, kind in [(span, ProductKind.INT4_INT8), (span + 32, ProductKind.INT4)]:
        int4 = Int4Linear(nn.Linear(inputs, 32, bias=False), buffer, 32)
        found = int4.decode_operands()
        assert found is not None and found.kind is kind
        assert found[1:] == (int4.weight, int4.scale, int4.minimum, 32, None, KERNEL_MAX_ROWS)
        int4.kernel = None  # off CPU float32: no compiled product serves it
        assert int4.decode_operands() is None


def test_without_the_kernel_the_reference_path_gives_the_same_answer(monkeypatch):
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536)
    x = torch.randn(2, 576)
    fast = [
        Int8Linear(linear, DenseBuffer(torch.empty(0))),
        Int4Linear(linear, DenseBuffer(torch.empty(0)), 64),
    ]
    slow = [
        Int8Linear(linear, DenseBuffer(torch.empty(0))),
        Int4Linear(linear, DenseBuffer(torch.empty(0)), 64),
    ]
    for module in slow:
        module.kernel = None
    # int8 exact; int4's kernel quantizes the activations, within a stated tolerance.
    assert torch.allclose(fast[0](x), slow[0](x), rtol=1e-4, atol=1e-4)
    assert _relative(fast[1](x), slow[1](x)) < 0.03


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine_args", "bar"),
    [({"quantization": "int8"}, 0.90), ({"kv_cache_dtype": "int8"}, 0.95)],
    ids=["int8-weights", "int8-kv-cache"],
)
def test_smollm2_answers_and_agrees_with_float32(smollm2, corpus_ids, engine_args, bar):
    prompts = [corpus_ids[i * 40 : i * 40 + 60] for i in range(8)]
    greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    reference = LLM(str(smollm2), max_model_len=512, kv_cache_bytes=64 << 20, dtype="float32")
    expected = [o.outputs[0].token_ids for o in reference.generate(prompts, greedy)]
    del reference
    llm = LLM(
        str(smollm2), max_model_len=512, kv_cache_bytes=64 << 20, **engine_args, dtype="float32"
    )
    answer = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=20, temperature=0.0),
    )
    assert "Paris" in answer[0].outputs[0].text
    # Teacher-forced: the next token after each prefix of float32's own greedy output. Shared
    # prefixes hit the prefix cache, so with an int8 cache most of these prefill after cached
    # (quantized) context rather than attending to fresh float keys.
    contexts = [p + e[:t] for p, e in zip(prompts, expected, strict=True) for t in range(32)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    predicted = [o.outputs[0].token_ids[0] for o in llm.generate(contexts, one)]
    truth = [token for e in expected for token in e]
    agreement = sum(a == b for a, b in zip(predicted, truth, strict=True)) / len(truth)
    print({f"{engine_args}_teacher_forced_greedy_agreement": agreement})
    assert agreement >= bar  # int8 weights: the bar


def test_unsupported_combinations_fail_at_start(smollm2):
    with pytest.raises(
        ConfigError, match=r"fp8 weights need a CUDA GPU of compute capability 8\.9"
    ):
        LLM(
            str(smollm2), device="cpu", quantization="fp8", kv_cache_bytes=16 << 20, dtype="float32"
        )
    # SmolLM2's hidden size is 576 = 4.5 x 128.
    with pytest.raises(ConfigError, match=r"int4 group size 128 does not divide .* 576 inputs"):
        LLM(str(smollm2), quantization="int4", quantization_group_size=128, dtype="float32")
    with pytest.raises(ConfigError, match="quantization_group_size must be 32, 64 or 128"):
        EngineConfig(quantization="int4", quantization_group_size=48)
    with pytest.raises(ConfigError, match="quantization 'int3' is not supported"):
        EngineConfig(quantization="int3")


def test_fp8_on_the_cpu_is_refused_before_any_weight_is_read(tiny_dir, tmp_path):
    """The refusal comes first: a checkpoint whose weights are missing still gets it, not a
    load error (the whole model used to be read only to be refused)."""
    for file in tiny_dir("llama").iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, tmp_path / file.name)
    with pytest.raises(ConfigError, match="fp8 weights need a CUDA GPU"):
        LLM(str(tmp_path), device="cpu", quantization="fp8", kv_cache_bytes=16 << 20)
