"""dtype bfloat16 on CPU: bfloat16 matrices in a float32 model (engine/layers/half_matrices.py).

The oracle is Hugging Face's model in float32 with each linear layer doing what HalfLinear
does (input and weight rounded to bfloat16, the product returned as float32): greedy output
equal token for token (up to a tie one bfloat16 step wide in the oracle's logits), through the
engine's batching, chunked prefill and decode kernels."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers.half_matrices import HalfLinear

MiB = 1 << 20


def _hf_half_model(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight, bias = module.weight.detach().bfloat16(), module.bias

            def forward(x, weight=weight, bias=bias):
                out = F.linear(x.bfloat16(), weight).float()
                return out if bias is None else out + bias

            module.forward = forward
    return model


def _hf_half_greedy(model, prompts, max_tokens) -> list[list[int]]:
    outputs = []
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_tokens, strict=True):
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=model.config.eos_token_id,
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral-window"])
def test_bfloat16_matrices_match_hf_doing_the_same(tiny_dir, corpus_ids, name):
    path = tiny_dir(name)
    llm = LLM(str(path), dtype="bfloat16", kv_cache_bytes=32 * MiB, max_num_batched_tokens=48)
    model = llm.engine.model
    layer = model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, HalfLinear)
    assert isinstance(layer.mlp.down_proj, HalfLinear) and isinstance(model.lm_head, HalfLinear)
    # Everything between the matrices stays float32, so the compiled kernels serve it.
    assert model.embed_tokens.weight.dtype == torch.float32
    assert llm.engine.runner.kv_cache[0].k.dtype == torch.float32
    assert llm.engine.runner.kernel is not None
    rng = random.Random(3)
    prompts = [corpus_ids[(s := rng.randrange(500)) : s + n] for n in (3, 40, 90, 17, 130)]
    max_tokens = [20, 12, 25, 30, 9]
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in max_tokens]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    oracle = _hf_half_model(path)
    expected = _hf_half_greedy(oracle, prompts, max_tokens)
    for prompt, ours, theirs in zip(prompts, got, expected, strict=True):
        _equal_up_to_a_tie(oracle, prompt, ours, theirs)


def _equal_up_to_a_tie(oracle, prompt, ours, expected) -> None:
    """Token for token; a difference only where the oracle's own two logits are within one
    bfloat16 step of each other. Its logits are bfloat16 products, so two tokens a step apart
    are a tie that float32 rounding elsewhere (a sum in another order) may break either way; the
    outputs then go separate ways and only the prefix before it can be compared."""
    if ours == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(ours, expected, strict=False)) if a != b), None)
    assert at is not None, f"lengths differ: {len(ours)} vs {len(expected)}"
    with torch.inference_mode():
        logits = oracle(torch.tensor([prompt + expected[:at]])).logits[0, -1]
    top, mine = logits[expected[at]].item(), logits[ours[at]].item()
    step = 2.0 ** (torch.frexp(torch.tensor(top)).exponent.item() - 8)  # bfloat16: 8 bits
    assert 0 <= top - mine <= step, f"token {at}: {ours[at]} at {mine}, the oracle's at {top}"


def test_quantized_layers_stay_quantized_and_float32_stays_float32(tiny_dir):
    path = str(tiny_dir("llama"))
    int4 = LLM(path, dtype="bfloat16", quantization="int4", kv_cache_bytes=16 * MiB)
    layer = int4.engine.model.layers[0]
    assert type(layer.mlp.gate_up_proj).__name__ == "Int4Linear"
    assert isinstance(int4.engine.model.lm_head, HalfLinear)  # the float one left
    plain = LLM(path, kv_cache_bytes=16 * MiB, dtype="float32")  # the exact reference
    assert not any(isinstance(m, HalfLinear) for m in plain.engine.model.modules())
