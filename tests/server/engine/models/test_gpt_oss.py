"""gpt-oss beyond the every-architecture equality tests of test_equivalence_tiny.py (int8 and two
ranks: test_mixture_of_experts.py, test_tensor_parallel.py): what greedy tokens may not show
(the sinks' share of each softmax, in the probabilities), how the config and the stacked expert
tensors are read, the clamped SwiGLU against transformers' own, and the refusal of a
pre-quantized (MXFP4) checkpoint."""

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from kvpilot_common.errors import ModelLoadError
from kvpilot_common.experts import TOPK_SOFTMAX
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers.mlp import clamped_swiglu
from kvpilot_server.engine.models.loader import load_model
from kvpilot_server.engine.models.model_config import ModelConfig

MiB = 1 << 20
CPU = torch.device("cpu")


def test_logprobs_match_hf_through_the_sinks(tiny_dir, corpus_ids):
    """Every prompt position's log-probabilities, over both layer kinds (a prompt longer than
    the sliding window), equal transformers': a sink left out or misplaced moves them all."""
    path = tiny_dir("gpt-oss")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB)
    assert llm.engine.runner.kernel is None  # the compiled decode kernel has no sinks
    prompt = corpus_ids[30:90]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    found = llm.generate([prompt], params)[0].prompt_logprobs
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
    for position, sample in enumerate(found[1:], start=1):
        want = float(expected[position - 1, prompt[position]])
        torch.testing.assert_close(sample.logprob, want, atol=1e-4, rtol=1e-4)


def test_config_reads_routing_swiglu_sinks_windows_and_yarn(tiny_dir):
    path = tiny_dir("gpt-oss")
    cfg = ModelConfig.from_hf(AutoConfig.from_pretrained(path))
    rotary = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).model.rotary_emb
    assert torch.equal(cfg.inv_freq, rotary.inv_freq)
    assert cfg.rope_scaling == rotary.attention_scaling > 1  # yarn's attention factor
    assert cfg.experts.route == TOPK_SOFTMAX and not cfg.experts.normalize_top_k
    assert (cfg.experts.count, cfg.experts.top_k, cfg.experts.width) == (8, 2, 64)
    assert cfg.swiglu == (1.702, 1.5) and cfg.attention_sinks
    assert cfg.qkv_bias and cfg.o_bias and cfg.layer_windows == [24, None]


def test_stacked_experts_are_cut_deinterleaved_and_transposed(tiny_dir):
    """Each expert's gate rows are the even columns of transformers' gate_up_proj, its up rows
    the odd ones, [out, in]; down_proj transposed; biases likewise; router weight and bias."""
    path = tiny_dir("gpt-oss")
    model = load_model(path, torch.float32, CPU)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).model
    for ours, theirs in zip(model.layers, hf.layers, strict=True):
        stacked = theirs.mlp.experts
        assert torch.equal(ours.mlp.gate.weight, theirs.mlp.router.weight)
        assert torch.equal(ours.mlp.gate.bias, theirs.mlp.router.bias)
        assert torch.equal(ours.self_attn.sinks, theirs.self_attn.sinks)
        for e, expert in enumerate(ours.mlp.experts):
            gate_up, bias = stacked.gate_up_proj[e], stacked.gate_up_proj_bias[e]
            weight = torch.cat((gate_up[:, ::2].t(), gate_up[:, 1::2].t()))
            assert torch.equal(expert.gate_up_proj.weight, weight)
            assert torch.equal(expert.gate_up_proj.bias, torch.cat((bias[::2], bias[1::2])))
            assert torch.equal(expert.down_proj.weight, stacked.down_proj[e].t())
            assert torch.equal(expert.down_proj.bias, stacked.down_proj_bias[e])


def test_clamped_swiglu_equals_transformers():
    """On interleaved gate/up, as transformers applies it, with values past the limit."""
    config = AutoConfig.for_model("gpt_oss", hidden_size=8, intermediate_size=6, swiglu_limit=1.5)
    experts = GptOssExperts(config)
    torch.manual_seed(0)
    gate_up = torch.randn(5, 12) * 3
    expected = experts._apply_gate(gate_up)
    got = clamped_swiglu(gate_up[:, ::2], gate_up[:, 1::2], config.swiglu_alpha, 1.5)
    assert torch.equal(got, expected)


def test_an_mxfp4_checkpoint_is_refused_by_its_quantization(tiny_dir, tmp_path):
    """The released checkpoints' experts are MXFP4 blocks and scales, which kvpilot does not
    read: refused at load, naming the quantization, before any weight is read."""
    path = tmp_path / "mxfp4"
    shutil.copytree(tiny_dir("gpt-oss"), path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": []}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"pre-quantized checkpoints .*mxfp4"):
        load_model(path, torch.float32, CPU)
