"""The int8 lm_head (--lm-head-quantization): logits close to float32's on every path (kernel
with int8 activations, chunked expansion, bfloat16), the same argmax on most rows of the tiny
models, a tied embedding reading the same int8 table and an untied one left exact, the engine
generating with it, and values it does not support refused in words."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from kvpilot_common.errors import ConfigError
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.layers import lm_head_quant
from kvpilot_server.engine.layers.lm_head_quant import Int8Embedding, Int8LmHead, quantize_lm_head
from kvpilot_server.engine.layers.quant import KERNEL_MAX_ROWS, int8_activations, quantize_int8
from kvpilot_server.engine.models.loader import load_model

MiB = 1 << 20
CPU = torch.device("cpu")
# Relative logit error allowed: int8 per row keeps 8 bits of each row's range (test_quantization's
# int8 bar); bfloat16 adds its own rounding.
TOLERANCE = 0.01


def _kvpilot(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kvpilot_common.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _relative(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize("rows", [1, 5, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1, 70])
def test_logits_match_the_dequantized_table_and_stay_close_to_float(rows, monkeypatch):
    # A chunk size that does not divide the vocabulary: the last chunk is a short one.
    monkeypatch.setattr(lm_head_quant, "CHUNK_ROWS", 384)
    torch.manual_seed(0)
    weight = torch.randn(1000, 96) * 0.05
    x = torch.randn(rows, 96)
    head = Int8LmHead(weight)
    q, scale = quantize_int8(weight)
    # The kernel serving decode-sized batches multiplies int8 activations.
    xs = int8_activations(x) if rows <= KERNEL_MAX_ROWS else x
    reference = xs @ (q.float() * scale[:, None]).t()
    got = head(x)
    assert got.shape == (rows, 1000) and got.is_contiguous()
    assert torch.allclose(got, reference, rtol=1e-4, atol=1e-4)
    assert _relative(got, x @ weight.t()) < TOLERANCE


def test_without_the_kernel_the_chunked_path_gives_the_same_logits():
    torch.manual_seed(0)
    weight = torch.randn(3000, 64)
    x = torch.randn(3, 64)
    fast, slow = Int8LmHead(weight), Int8LmHead(weight)
    slow.kernel = None
    assert fast.kernel is not None  # CPU float32: decode rows take the AVX2 kernel
    # The same table; the kernel's int8 activations cost a little (quant.int8_activations).
    assert _relative(fast(x), slow(x)) < TOLERANCE


def test_a_bfloat16_head_expands_chunks_as_cuda_does():
    torch.manual_seed(0)
    weight = (torch.randn(2500, 64) * 0.05).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    head = Int8LmHead(weight)
    assert head.kernel is None
    got = head(x)
    assert got.dtype == torch.bfloat16
    assert _relative(got.float(), x.float() @ weight.float().t()) < TOLERANCE + 0.01


@pytest.mark.parametrize("name", ["llama", "qwen2"])  # untied, tied
def test_tiny_models_keep_the_argmax_and_the_embedding_rule(tiny_dir, name):
    model = load_model(tiny_dir(name), torch.float32, CPU)
    tied = model.lm_head.weight is model.embed_tokens.weight
    assert tied == (name == "qwen2")
    weight = model.lm_head.weight.detach().clone()
    embedding = model.embed_tokens.weight.detach().clone()
    quantize_lm_head(model, "int8", CPU)
    assert isinstance(model.lm_head, Int8LmHead)
    torch.manual_seed(0)
    hidden = model.norm(torch.randn(64, weight.shape[1]))
    with torch.no_grad():
        got, exact = model.lm_head(hidden), hidden @ weight.t()
    assert _relative(got, exact) < TOLERANCE
    same = (got.argmax(dim=1) == exact.argmax(dim=1)).float().mean().item()
    print({f"{name}_argmax_agreement": same})
    assert same >= 0.9
    ids = torch.tensor([0, 5, 17, 5])
    looked_up = model.embed_tokens(ids)
    if tied:  # one int8 table for both: no float copy kept
        assert isinstance(model.embed_tokens, Int8Embedding)
        assert model.embed_tokens.weight is model.lm_head.weight
        assert looked_up.dtype == torch.float32
        assert _relative(looked_up, embedding[ids]) < TOLERANCE
    else:  # untied: the embedding is untouched, exact
        assert isinstance(model.embed_tokens, nn.Embedding)
        assert torch.equal(looked_up, embedding[ids])


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_the_engine_generates_with_an_int8_lm_head(tiny_dir, name):
    prompts = [[5 + i, 9, 13 + 2 * i, 40] for i in range(6)]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    path = str(tiny_dir(name))
    exact = LLM(path, kv_cache_bytes=16 * MiB).generate(prompts, greedy)
    llm = LLM(path, kv_cache_bytes=16 * MiB, lm_head_quantization="int8", quantization="int8")
    got = llm.generate(prompts, greedy)
    assert all(len(o.outputs[0].token_ids) == 8 for o in got)
    # The first token follows the same float prefill up to the head: mostly the same choice.
    firsts = [
        a.outputs[0].token_ids[0] == b.outputs[0].token_ids[0]
        for a, b in zip(got, exact, strict=True)
    ]
    assert sum(firsts) >= len(firsts) - 1


def test_unsupported_values_are_refused_in_words(tiny_dir):
    with pytest.raises(ConfigError, match=r"lm_head_quantization 'int4' is not supported"):
        EngineConfig(lm_head_quantization="int4")
    model = load_model(tiny_dir("llama"), torch.float32, CPU)
    with pytest.raises(ConfigError, match=r"lm_head quantization 'fp8' is not supported"):
        quantize_lm_head(model, "fp8", CPU)
    done = _kvpilot(
        "generate", "hi", "--model", str(tiny_dir("llama")), "--lm-head-quantization=int4"
    )
    assert done.returncode != 0 and "lm_head_quantization 'int4' is not supported" in done.stderr


def test_generate_from_the_command_line_with_an_int8_lm_head(tiny_dir):
    model = str(tiny_dir("qwen2"))
    done = _kvpilot(
        "generate",
        "The river starts",
        "--model",
        model,
        "--kv-cache-bytes",
        "16MiB",
        "--max-tokens",
        "5",
        "--lm-head-quantization",
        "int8",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["usage"]["completion_tokens"] == 5
