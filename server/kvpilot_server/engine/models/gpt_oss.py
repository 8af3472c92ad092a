"""gpt-oss (`GptOssForCausalLM`): Llama's decoder (models/llama.py) with what transformers'
GptOss adds, each where the other families keep the same kind of thing:

- attention: biases on q, k, v and o (attention_bias), a learned sink logit per head in each
  softmax (ModelConfig.attention_sinks; layers/attention.py's eager path, which is also why the
  model runner keeps the compiled decode kernel off), sliding and full layers alternating
  (layer_types), yarn rope (model_config.py), an explicit head_dim;
- every layer a mixture of experts (layers/moe.py): a router with a bias that takes the top-k
  logits, then a softmax over those (kvpilot_common.experts' TOPK_SOFTMAX); experts with biases
  and a clamped SwiGLU (layers/mlp.py's clamped_swiglu), the down bias weighted with the rest of
  the expert's output;
- Llama's RMSNorm, an untied lm_head.

transformers holds each layer's experts as four stacked tensors, and saves them so:
`mlp.experts.gate_up_proj` [experts, hidden, 2 * width] with gate and up interleaved (gate the
even columns, up the odd ones), `gate_up_proj_bias` [experts, 2 * width], `down_proj` [experts,
width, hidden], `down_proj_bias` [experts, hidden]: inputs first, nn.Linear's transpose.
checkpoint_parts cuts them into the per-expert gate_proj, up_proj and down_proj a Mixtral-style
checkpoint holds, [out, in], so the loader fuses and shards each part as it does theirs. The
released checkpoints store the two expert weights in MXFP4 (`*_blocks`, `*_scales`): the loader
dequantizes each pair into this same stacked layout first (models/mxfp4.py).
"""

import torch
from torch import nn

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.layers.moe import SparseMoe
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig

_EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


class GptOssForCausalLM(LlamaForCausalLM):
    def build_mlp(self, cfg: ModelConfig, index: int, tp: TensorParallel) -> nn.Module:
        return SparseMoe(cfg.hidden_size, cfg.experts, tp, bias=True, swiglu=cfg.swiglu)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        """The router is `mlp.router` in the checkpoint, `mlp.gate` in SparseMoe (Qwen's name)."""
        return name.replace(".mlp.router.", ".mlp.gate.")

    @staticmethod
    def checkpoint_parts(
        name: str, tensor: torch.Tensor, full: ModelConfig
    ) -> list[tuple[str, torch.Tensor]]:
        """A layer's stacked expert tensor as each expert's parts, `...experts.<e>.<proj>.<leaf>`,
        weights [out, in], at the whole model's sizes (sharding comes after, per part)."""
        module, _, kind = name.rpartition(".")
        if not module.endswith(".experts") or kind not in _EXPERT_TENSORS:
            return [(name, tensor)]
        experts, hidden = full.experts, full.hidden_size
        width = experts.width
        expected = {
            "gate_up_proj": (experts.count, hidden, 2 * width),
            "gate_up_proj_bias": (experts.count, 2 * width),
            "down_proj": (experts.count, width, hidden),
            "down_proj_bias": (experts.count, hidden),
        }[kind]
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(
                f"Weight {name} has shape {tuple(tensor.shape)}, expected {expected} (experts, "
                "then inputs and outputs as transformers' GptOssExperts stores them)"
            )
        leaf = "bias" if kind.endswith("_bias") else "weight"
        parts = []
        for e, stacked in enumerate(tensor):
            prefix = f"{module}.{e}"
            if kind.startswith("gate_up_proj"):
                # Even columns gate, odd ones up (GptOssExperts._apply_gate); a weight's
                # columns are its outputs, so each part is transposed to [out, in].
                gate, up = stacked[..., ::2], stacked[..., 1::2]
                if leaf == "weight":
                    gate, up = gate.t(), up.t()
                parts += [(f"{prefix}.gate_proj.{leaf}", gate), (f"{prefix}.up_proj.{leaf}", up)]
            else:
                down = stacked.t() if leaf == "weight" else stacked
                parts.append((f"{prefix}.down_proj.{leaf}", down))
        return parts
