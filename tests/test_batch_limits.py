"""kvpilot_common.batch_limits is the one rule for the batch limits and block size a deployment
leaves unset: the engine applies it to the device it finds, `kvpilot plan` and the operator's fit
check to the GPU a spec names, and the pod's flags pass only what the spec sets, so the engine's
choice and the fit check's cannot differ."""

import argparse
import contextlib
import dataclasses
import io
import json
import types
from pathlib import Path

import pytest
import torch
import yaml
from transformers import LlamaConfig

from kvpilot_common import batch_limits
from kvpilot_common.batch_limits import BatchLimits
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_common.memory_model import GPU_MEMORY_MIB, MiB, plan
from kvpilot_common.step_memory import GRAPH_SCRATCH_BLOCKS
from kvpilot_operator import crd
from kvpilot_operator.engine_flags import engine_args
from kvpilot_operator.memory_plan import device_memory_bytes, limits, replica_plan
from kvpilot_operator.spec import Spec
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.models import model_setup
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_server.plan import add_plan_args, run_plan
from kvpilot_testing.tiny import TINY_BASE

ROOT = Path(__file__).parents[1]
GiB = 1 << 30
LLAMA_8B = "hf://meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    ("gpu", "memory", "name", "flash", "expected"),
    [
        (False, None, "", False, (64, 2048, 16)),
        (False, 512 * GiB, "", True, (64, 2048, 16)),  # a CPU's memory: no tier, no flash
        (True, 141 * GiB, "NVIDIA H200", True, (256, 8192, 256)),
        (True, 80 * GiB, "NVIDIA H100 80GB HBM3", True, (256, 8192, 256)),
        (True, 80 * GiB, "NVIDIA A100-SXM4-80GB", True, (256, 2048, 256)),
        (True, 22 * GiB, "NVIDIA L4", True, (256, 2048, 256)),
        (True, None, "", True, (256, 2048, 256)),  # memory unknown: the smaller tier
        # The flash path cannot read the cache: small blocks share more prefixes, pad less.
        (True, 141 * GiB, "NVIDIA H200", False, (256, 8192, 16)),
    ],
)
def test_the_limits_follow_the_device(gpu, memory, name, flash, expected):
    chosen = batch_limits.defaults(gpu=gpu, memory=memory, name=name, flash=flash)
    assert chosen == BatchLimits(*expected)


@pytest.mark.parametrize(
    ("dtype", "kv", "expected"),
    [
        ("bfloat16", "auto", True),
        ("float16", "auto", True),
        ("float32", "auto", False),
        ("bfloat16", "int8", False),
        ("bfloat16", "fp8", False),
    ],
)
def test_what_settings_show_of_the_flash_path(dtype, kv, expected):
    assert batch_limits.flash_may_read(dtype, kv) is expected


def test_a_gpus_flash_block_size_is_one_the_flash_path_reads(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    block = batch_limits.defaults(gpu=True, memory=80 * GiB, flash=True).block_size
    reason = flash_attention.unusable(cuda, bf16, False, False, block)
    assert "block" not in reason  # only this torch's varlen_attn may still keep it off
    # A block size given that the flash path cannot read says so, and how to mend it.
    assert "--block-size 256" in flash_attention.unusable(cuda, bf16, False, False, 16)


def test_what_is_given_is_kept_and_only_the_rest_chosen():
    config = EngineConfig(max_num_seqs=3, block_size=32)
    chosen = batch_limits.defaults(gpu=True, memory=141 * GiB, flash=True)
    assert config.settle_limits(chosen) == BatchLimits(3, 8192, 32)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.block_size) == (3, 8192, 32)


def _model_config() -> ModelConfig:
    shape = {**TINY_BASE, "vocab_size": 256, "architectures": ["LlamaForCausalLM"]}
    return ModelConfig.from_hf(LlamaConfig(**shape))


def test_the_engine_reads_the_gpu_and_the_model_it_has(monkeypatch):
    # No GPU here: the driver's answers are stood in, as torch gives them on each GPU.
    def gpu(name: str, mib: int, capability: tuple[int, int] = (9, 0)) -> None:
        props = types.SimpleNamespace(total_memory=mib * MiB)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)

    monkeypatch.setattr(flash_attention, "_varlen", lambda: object())  # a torch that has it
    cuda, bf16, llama = torch.device("cuda"), torch.bfloat16, _model_config()
    gpu("NVIDIA H200", GPU_MEMORY_MIB["H200"])
    assert model_setup.device_limits(cuda, bf16, llama, "auto") == BatchLimits(256, 8192, 256)
    # What keeps the flash path off keeps the small blocks: a quantized cache, a float32 model,
    # attention the flash kernel lacks (gpt-oss's sinks), an older GPU, a torch without it.
    assert model_setup.device_limits(cuda, bf16, llama, "int8") == BatchLimits(256, 8192, 16)
    assert model_setup.device_limits(cuda, torch.float32, llama, "auto").block_size == 16
    sinks = dataclasses.replace(llama, attention_sinks=True)
    assert model_setup.device_limits(cuda, bf16, sinks, "auto").block_size == 16
    gpu("Tesla T4", GPU_MEMORY_MIB["T4"], capability=(7, 5))
    assert model_setup.device_limits(cuda, bf16, llama, "auto") == BatchLimits(256, 2048, 16)
    gpu("NVIDIA A100-SXM4-80GB", GPU_MEMORY_MIB["A100-80GB"], capability=(8, 0))
    assert model_setup.device_limits(cuda, bf16, llama, "auto") == BatchLimits(256, 2048, 256)
    monkeypatch.setattr(flash_attention, "_varlen", lambda: None)
    assert model_setup.device_limits(cuda, bf16, llama, "auto").block_size == 16
    cpu = torch.device("cpu")
    assert model_setup.device_limits(cpu, torch.float32, llama, "auto") == batch_limits.CPU


def _spec(gpu_type: str | None, **engine) -> Spec:
    body = {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"source": LLAMA_8B},
            "engine": {"maxModelLen": 8192, **engine},
            "resources": {"gpus": 1, **({"gpuType": gpu_type} if gpu_type else {})},
        },
    }
    return Spec.from_defaulted(crd.with_defaults(body))


def _plan(*args: str) -> dict:
    parser = argparse.ArgumentParser()
    add_plan_args(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_plan(
            parser.parse_args(["--json", "--model", LLAMA_8B, "--max-model-len", "8192", *args])
        )
    return json.loads(out.getvalue())


@pytest.mark.parametrize("gpu_type", ["H200", "A100-80GB", "L4"])
def test_plan_and_the_fit_check_size_a_gpu_as_its_engine_will(gpu_type):
    spec = _spec(gpu_type)
    memory = device_memory_bytes(spec)
    assert memory == GPU_MEMORY_MIB[gpu_type] * MiB
    step = limits(spec, memory)
    engine = batch_limits.defaults(gpu=True, memory=memory, name=f"NVIDIA {gpu_type}", flash=True)
    assert step == engine  # the fit check's choice is the engine's on that GPU
    plan = _plan("--gpu-type", gpu_type)
    assert (plan["max_num_seqs"], plan["max_num_batched_tokens"]) == (
        step.max_num_seqs,
        step.max_num_batched_tokens,
    )
    assert plan["kv_cache_tokens"] == replica_plan(spec, KNOWN_MODELS[LLAMA_8B], memory).kv_tokens
    # The larger token budget costs the cache what its activations take.
    if gpu_type == "H200":
        small = _plan("--gpu-type", gpu_type, "--max-num-batched-tokens", "2048")
        assert small["step_workspace_mib"] > 0
        assert plan["step_workspace_mib"] > small["step_workspace_mib"]
        assert plan["kv_cache_tokens"] < small["kv_cache_tokens"]


def test_a_pod_is_given_only_the_limits_its_spec_sets():
    unset = engine_args(_spec("H200"), "m")
    flags = ("--block-size", "--max-num-seqs", "--max-num-batched-tokens")
    assert not [arg for arg in unset if arg.startswith(flags)]  # the engine chooses from its GPU
    given = engine_args(_spec("H200", blockSize=16, maxNumSeqs=8, maxNumBatchedTokens=4096), "m")
    assert {"--block-size=16", "--max-num-seqs=8", "--max-num-batched-tokens=4096"} <= set(given)
    # And the fit check sizes what the spec sets.
    spec = _spec("H200", maxNumSeqs=8, maxNumBatchedTokens=4096)
    assert limits(spec, device_memory_bytes(spec)) == BatchLimits(8, 4096, 256)


def test_the_crd_leaves_the_limits_to_the_device():
    files = [ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml"]
    files.append(ROOT / "charts" / "kvpilot" / "crd" / "modeldeployments.kvpilot.dev.yaml")
    for path in files:
        version = yaml.safe_load(path.read_text())["spec"]["versions"][0]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        engine = spec["properties"]["engine"]["properties"]
        for field in ("blockSize", "maxNumSeqs", "maxNumBatchedTokens"):
            assert "default" not in engine[field], (path, field)
        assert batch_limits.FLASH_PAGE in engine["blockSize"]["enum"]
        assert batch_limits.SMALL_BLOCK in engine["blockSize"]["enum"]


def test_a_plan_counts_the_whole_blocks_the_engine_pools():
    # The engine's cache is whole blocks, less the scratch block a GPU's graphs keep
    # (llm_engine: pooled = blocks - GRAPH_SCRATCH_BLOCKS): a plan counts the same tokens.
    shape = KNOWN_MODELS[LLAMA_8B]
    loose = plan(shape, 80 * GiB, 8192, dtype="bfloat16")
    whole = plan(shape, 80 * GiB, 8192, dtype="bfloat16", block_size=256, reserved_blocks=1)
    blocks = loose.kv_cache_bytes // (loose.kv_bytes_per_token * 256)
    assert whole.kv_tokens == (blocks - GRAPH_SCRATCH_BLOCKS) * 256 < loose.kv_tokens
    # A cache of exactly one sequence's tokens holds none once the scratch block is out.
    exact = dataclasses.replace(whole, kv_cache_bytes=8192 * whole.kv_bytes_per_token)
    assert exact.kv_tokens == 8192 - 256 and not exact.fits
    assert dataclasses.replace(exact, reserved_blocks=0).fits


def test_plan_and_the_fit_check_give_a_model_the_block_size_its_engine_will():
    # gpt-oss's attention sinks keep the flash path off: its engine takes blocks of 16.
    gpt_oss = "hf://openai/gpt-oss-20b"
    assert _plan("--gpu-type", "H100-80GB")["block_size"] == batch_limits.FLASH_PAGE
    parser = argparse.ArgumentParser()
    add_plan_args(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_plan(parser.parse_args(["--json", "--model", gpt_oss, "--gpu-type", "H100-80GB"]))
    assert json.loads(out.getvalue())["block_size"] == batch_limits.SMALL_BLOCK
    spec = _spec("H100-80GB")
    assert limits(spec, 80 * GiB, "GptOssForCausalLM").block_size == batch_limits.SMALL_BLOCK
    assert limits(spec, 80 * GiB, "LlamaForCausalLM").block_size == batch_limits.FLASH_PAGE
    # Without graphs no scratch block is kept: one block's more tokens.
    eager = _plan("--gpu-type", "H100-80GB", "--enforce-eager")
    graphs = _plan("--gpu-type", "H100-80GB")
    assert eager["kv_cache_tokens"] - graphs["kv_cache_tokens"] == batch_limits.FLASH_PAGE
