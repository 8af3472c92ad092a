"""gpt-oss beyond the every-architecture equality tests of test_equivalence_tiny.py (int8 and two
ranks: test_mixture_of_experts.py, test_tensor_parallel.py): what greedy tokens may not show
(the sinks' share of each softmax, in the probabilities), how the config and the stacked expert
tensors are read, the clamped SwiGLU against transformers' own, and checkpoints that store the
experts in MXFP4, as the releases do (read as transformers' dequantizing load reads them), beside
the stored forms refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from kvpilot_common.errors import ModelLoadError
from kvpilot_common.experts import TOPK_SOFTMAX
from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers.mlp import clamped_swiglu
from kvpilot_server.engine.models.loader import load_model
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_testing.hf_reference import int8_reference
from kvpilot_testing.mxfp4 import save_mxfp4_copy

MiB = 1 << 20
CPU = torch.device("cpu")


def test_logprobs_match_hf_through_the_sinks(tiny_dir, corpus_ids):
    """Every prompt position's log-probabilities, over both layer kinds (a prompt longer than
    the sliding window), equal transformers': a sink left out or misplaced moves them all."""
    path = tiny_dir("gpt-oss")
    llm = LLM(str(path), kv_cache_bytes=16 * MiB, dtype="float32")
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


@pytest.fixture(scope="module")
def mxfp4_dir(tiny_dir, tmp_path_factory):
    """The tiny gpt-oss with its experts stored in MXFP4 blocks and scales."""
    return save_mxfp4_copy(tiny_dir("gpt-oss"), tmp_path_factory.mktemp("mxfp4") / "gpt-oss")


def test_mxfp4_experts_load_as_transformers_dequantizes_them(mxfp4_dir, tiny_dir):
    """Every expert weight equals transformers' dequantizing load of the same files, bit for
    bit, and none equals the float weights the copy was written from (4 bits were stored)."""
    model = load_model(mxfp4_dir, torch.float32, CPU)
    hf = AutoModelForCausalLM.from_pretrained(mxfp4_dir, dtype=torch.float32).model
    source = load_model(tiny_dir("gpt-oss"), torch.float32, CPU)
    for ours, theirs, floats in zip(model.layers, hf.layers, source.layers, strict=True):
        stacked = theirs.mlp.experts
        for e, expert in enumerate(ours.mlp.experts):
            gate_up = stacked.gate_up_proj[e]
            weight = torch.cat((gate_up[:, ::2].t(), gate_up[:, 1::2].t()))
            assert torch.equal(expert.gate_up_proj.weight, weight)
            assert torch.equal(expert.down_proj.weight, stacked.down_proj[e].t())
            assert not torch.equal(weight, floats.mlp.experts[e].gate_up_proj.weight)
            assert torch.equal(expert.down_proj.bias, floats.mlp.experts[e].down_proj.bias)


def test_an_mxfp4_checkpoint_generates_as_transformers_does(mxfp4_dir, hf_greedy, corpus_ids):
    """Greedy tokens equal transformers' on the same MXFP4 files, through prefills longer than
    the sliding window, chunked, and a prefix-cache hit (the third prompt repeats the first's
    start); int8 on top equals transformers computing with the same int8 weights."""
    prompts = [corpus_ids[10:70], corpus_ids[200:213], corpus_ids[10:50] + corpus_ids[400:420]]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    llm = LLM(str(mxfp4_dir), kv_cache_bytes=16 * MiB, max_num_batched_tokens=32, dtype="float32")
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        assert out.outputs[0].token_ids == hf_greedy(mxfp4_dir, prompt, 12)
    int8 = LLM(str(mxfp4_dir), quantization="int8", kv_cache_bytes=16 * MiB, dtype="float32")
    reference = int8_reference(mxfp4_dir)
    for prompt, out in zip(prompts, int8.generate(prompts, params), strict=True):
        assert out.outputs[0].token_ids == reference.greedy(prompt, 12)


def _with_config(source, target, **changes):
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **changes}))
    return target


@pytest.mark.parametrize(
    ("model", "method"), [("gpt-oss", "gptq"), ("gpt-oss", "awq"), ("llama", "mxfp4")]
)
def test_other_stored_quantizations_are_refused_by_name(model, method, tiny_dir, tmp_path):
    """Only gpt-oss's MXFP4 experts are read: any other pre-quantized form, or MXFP4 on a
    family whose checkpoints transformers never writes so, is refused before a weight is read."""
    config = {"quant_method": method, "bits": 4}
    path = _with_config(tiny_dir(model), tmp_path / method, quantization_config=config)
    with pytest.raises(ModelLoadError, match=rf"pre-quantized checkpoints .*: {method}\)"):
        load_model(path, torch.float32, CPU)


def test_an_mxfp4_tensor_without_its_scales_is_named(mxfp4_dir, tmp_path):
    path = tmp_path / "half"
    shutil.copytree(mxfp4_dir, path)
    file = next(path.glob("*.safetensors"))
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.experts\.down_proj_blocks but no"):
        load_model(path, torch.float32, CPU)
