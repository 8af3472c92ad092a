"""A decode step through every decoder layer as one compiled call (kernels/csrc/decode_stack.cpp).

At batch 1 the Python between a layer's kernels (module calls, views, splits) took about as
long as its int4 products; the stack calls the same kernels in the same order from C++, so its
output equals the modules' bit for bit (tests/server/engine/kernels/test_decode_stack.py holds it
to that). It serves what those kernels serve: CPU float32 models whose decoder linears a compiled
product runs (int4, int8, or float32 where layers/linear.py measured the compiled float32
products fastest) or oneDNN's packed bfloat16 product (dtype bfloat16 on CPU, whose other parts
are float32), no tensor parallelism, no q/k norms, Llama's layer (two norms, silu gates, the
head_dim ** -0.5 query scale: not Gemma's), a float32 KV cache, and steps that are pure decodes of
at most as many sequences as every one of those products serves (kernels/operands.py's
max_rows). The modules' loop (models/llama.py) runs everything else and stays the definition.
"""

from typing import Any

import torch
from torch import nn

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.attention import AttentionMetadata, DecodeGroup
from kvpilot_server.engine.layers.kv_cache import LayerCache
from kvpilot_server.engine.layers.linear import DECODE_MAX_ROWS


def build(model: nn.Module) -> Any | None:
    """A llama.LlamaForCausalLM's stack (a csrc DecodeStack holding its weights), or None when
    some part of the model is not one the stack runs. Build it once the weights are final."""
    cfg, weight = model.cfg, model.norm.weight
    # The device first: loading the kernels may compile them, which a CUDA model must never
    # wait for (its first request would).
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    if model.tp.size != 1 or cfg.qk_norm or cfg.experts is not None:
        return None
    # Gemma (models/gemma.py): four norms a layer, gelu gates, its own query scale.
    if cfg.activation != "silu" or cfg.attention_scale is not None:
        return None
    kernel = cpu_kernels.load()
    if kernel is None:
        return None
    stack = kernel.DecodeStack(
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        cfg.head_dim**-0.5,  # as layers/attention.py's decode passes it
        DECODE_MAX_ROWS,  # float32 products: float32_linear up to here, float32_gemm beyond
    )
    for layer, window in zip(model.layers, cfg.layer_windows, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        linears = [_linear(kernel, m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj)]
        linears.append(_linear(kernel, mlp.down_proj))
        if any(linear is None for linear in linears):
            return None
        norms = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        stack.add_layer(*norms, *linears, window or 0)
    return stack


def _linear(kernel: Any, module: nn.Module) -> Any | None:
    """The stack's copy of one decoder linear, or None when no compiled product serves it (an
    unpacked bfloat16 layer, one off the CPU, or MKL measured fastest). A LoRA wrapper's base
    serves: the stack runs only steps without adapter rows (models/llama.py)."""
    module = getattr(module, "base", module)
    operands = getattr(module, "decode_operands", None)
    found = None if operands is None else operands()
    if found is None:
        return None
    kind, weight, scale, minimum, group, bias, max_rows = found
    return kernel.stack_linear(kind.value, weight, scale, minimum, group, bias, max_rows)


def decode_group(
    metas: dict[int | None, AttentionMetadata], rows: int, caches: list[LayerCache], max_rows: int
) -> DecodeGroup | None:
    """The step's one decode group when a stack serving up to `max_rows` rows serves the step,
    else None. Every window's metadata holds the same group: with the decode kernel, windows
    only change the kernel's `window` argument, which the stack has per layer."""
    first = caches[0]
    if rows > max_rows or first.k_scale is not None or first.k.dtype != torch.float32:
        return None
    for meta in metas.values():
        if meta.kernel is None or meta.prefills or meta.prefill_batch or len(meta.decodes) != 1:
            return None
    return meta.decodes[0]
