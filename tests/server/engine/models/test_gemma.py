"""Gemma 2 and Gemma 3 beyond the every-architecture equality tests of test_equivalence_tiny.py:
what greedy tokens cannot show (the final logits' cap, norms in bfloat16, the per-layer-type
rope), int8 weights against Hugging Face running the same int8 weights, and which compiled paths
serve them."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.models.gemma import GemmaRMSNorm
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_testing.hf_reference import int8_reference

MiB = 1 << 20


def test_logprobs_match_hf_through_the_final_logit_cap(tiny_dir, corpus_ids):
    """A cap is monotone, so greedy tokens cannot show it; probabilities do. gemma2 caps its
    logits at 1, about their own size, so every probability moves."""
    path = tiny_dir("gemma2")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, dtype="float32")
    prompt = corpus_ids[30:90]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    found = llm.generate([prompt], params)[0].prompt_logprobs
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf.config.final_logit_softcapping == 1.0
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
    for position, sample in enumerate(found[1:], start=1):
        want = float(expected[position - 1, prompt[position]])
        torch.testing.assert_close(sample.logprob, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_int8_matches_hf_on_the_same_int8_weights(name, tiny_dir, corpus_ids):
    """Decode steps take the int8 kernel, prefills the expanded weight: both equal transformers
    computing with the int8 weights in float32."""
    path = tiny_dir(name)
    llm = LLM(str(path), quantization="int8", kv_cache_bytes=16 * MiB, dtype="float32")
    prompts = [corpus_ids[s : s + n] for s, n in ((5, 3), (100, 40), (300, 120), (700, 17))]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    reference = int8_reference(path)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        assert out.outputs[0].token_ids == reference.greedy(prompt, 16)


def test_compiled_paths_serve_what_they_can(tiny_dir, corpus_ids):
    """Gemma 2's capped attention logits keep the decode kernel off; Gemma 3 decodes through it
    (with its own query scale). Neither runs the decode stack, even with int4 weights, where a
    Llama would."""
    gemma2 = LLM(str(tiny_dir("gemma2")), kv_cache_bytes=4 * MiB, dtype="float32")
    assert gemma2.engine.runner.kernel is None
    gemma3 = LLM(
        str(tiny_dir("gemma3")), quantization="int4", kv_cache_bytes=4 * MiB, dtype="float32"
    )
    gemma3.generate([corpus_ids[:20]], SamplingParams(max_tokens=3, temperature=0.0))
    assert gemma3.engine.runner.kernel is not None
    assert gemma3.engine.model.stack is None


def test_gemma3_config_reads_each_layer_types_rope_and_no_attention_cap(tiny_dir):
    """The full layers' linearly scaled 1M base and the sliding layers' 10k, as transformers'
    rotary embedding holds them; the attention softcap in its config, which transformers'
    Gemma 3 never applies, is not applied."""
    path = tiny_dir("gemma3")
    cfg = ModelConfig.from_hf(AutoConfig.from_pretrained(path))
    rotary = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).model.rotary_emb
    assert torch.equal(cfg.inv_freq, rotary.full_attention_inv_freq)
    assert torch.equal(cfg.local_inv_freq, rotary.sliding_attention_inv_freq)
    assert cfg.attn_logit_softcapping is None and cfg.attention_scale == 24**-0.5
    assert cfg.layer_windows == [24, None] and cfg.activation == "gelu_pytorch_tanh"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_equals_transformers(dtype):
    """1 + weight folded once equals transformers adding it on every call; in bfloat16 the
    float32 1 + weight is kept, and the product rounded once, bit for bit as transformers."""
    torch.manual_seed(0)
    weight = torch.randn(64) * 0.3
    theirs = Gemma2RMSNorm(64, eps=1e-6).to(dtype)
    ours = GemmaRMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(weight)
        ours.weight.copy_(weight)
    ours.fold()
    x, residual = (torch.randn(5, 64, dtype=dtype) * 3 for _ in range(2))
    with torch.inference_mode():
        expected = theirs(residual + x)
        alone = ours(residual + x)
        fused, total = ours(x, residual.clone())
    assert torch.equal(total, residual + x)
    if dtype == torch.bfloat16:
        assert torch.equal(alone, expected) and torch.equal(fused, expected)
    else:  # compiled kernels or F.rms_norm: the same sums, not always the same order
        torch.testing.assert_close(alone, expected, atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(fused, expected, atol=2e-6, rtol=2e-6)
