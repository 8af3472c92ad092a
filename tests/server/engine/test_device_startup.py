"""What a CUDA start must never do, checked where no GPU is: compile the CPU kernels for a model
that is not on the CPU, serve on the CPU without saying why when a GPU is in the machine, or
accept fp8 weights whose shapes torch._scaled_mm refuses (found at the first step, not at start)."""

import logging
from unittest import mock

import pytest
import torch
from transformers import LlamaConfig

from kvpilot_common.errors import ConfigError
from kvpilot_server.engine.kernels import cpu_kernels, decode_stack
from kvpilot_server.engine.layers import quant
from kvpilot_server.engine.models import model_setup
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    architectures=["LlamaForCausalLM"],
)


def _model(device: str, dtype: torch.dtype = torch.float32, **shape) -> LlamaForCausalLM:
    cfg = ModelConfig.from_hf(LlamaConfig(**{**SMALL, **shape}))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.to(dtype)
    return model if device == "meta" else model.to_empty(device=device)


def test_the_decode_stack_of_a_model_off_the_cpu_never_loads_the_cpu_kernels():
    # The stack is built at a model's first step; loading the kernels may compile them for
    # minutes. A model elsewhere than the CPU in float32 (meta stands for CUDA here) or in
    # another dtype must be turned away before the kernels are looked up.
    def forbidden():
        raise AssertionError("the CPU kernels were loaded")

    with mock.patch.object(cpu_kernels, "load", forbidden):
        assert decode_stack.build(_model("meta")) is None
        assert decode_stack.build(_model("cpu", torch.bfloat16)) is None


def test_device_auto_says_why_it_serves_on_the_cpu_beside_a_gpu(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    with caplog.at_level(logging.WARNING, logger=model_setup.__name__):
        assert model_setup.resolve_device("auto") == torch.device("cpu")
    assert "cannot use it" in caplog.text and "CUDA 13.0" in caplog.text
    caplog.clear()
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")
    monkeypatch.setattr(model_setup, "Path", lambda p: mock.Mock(exists=lambda: False))
    with caplog.at_level(logging.WARNING, logger=model_setup.__name__):
        assert model_setup.resolve_device("auto") == torch.device("cpu")
    assert caplog.text == ""  # a machine without a GPU: nothing to warn about


@pytest.mark.parametrize(
    ("shape", "name"),
    [({"hidden_size": 72}, "qkv_proj"), ({"intermediate_size": 120}, "down_proj")],
)
def test_fp8_weights_of_shapes_scaled_mm_refuses_fail_at_start_and_change_nothing(shape, name):
    model = _model("cpu", **shape)
    before = {n: type(m) for n, m in model.named_modules()}
    # As on a GPU that runs fp8 (this machine's CPU does not: the capability check is stood in).
    with mock.patch.object(quant.precision, "fp8_capable", lambda capability: True):
        with pytest.raises(ConfigError, match=rf"multiples of 16; {name} has"):
            quant.quantize(model, "fp8", torch.device("cpu"))
        assert {n: type(m) for n, m in model.named_modules()} == before  # nothing half-done
        quant.quantize(_model("cpu"), "fp8", torch.device("cpu"))  # sizes of 16s pass


def test_the_flash_path_names_what_keeps_it_off(monkeypatch):
    from kvpilot_server.engine.layers.flash_attention import unusable

    cuda, bf16 = torch.device("cuda"), torch.bfloat16  # a device named; its answers stood in
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))  # a T4
    assert "compute capability 8.0 or newer, not 7.5" in unusable(cuda, bf16, False, False, 256)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert "not a CUDA device" in unusable(torch.device("cpu"), bf16, False, False, 256)
    assert "--block-size 256" in unusable(cuda, bf16, False, False, 16)
    assert "16-bit" in unusable(cuda, torch.float32, False, False, 256)
    assert "quantized KV cache" in unusable(cuda, bf16, True, False, 256)
    assert "softcapping" in unusable(cuda, bf16, False, True, 256)
