"""Phi-3 and Phi-4 (`Phi3ForCausalLM`): Llama's decoder, with q/k/v and gate/up stored fused in
the checkpoint. The model is llama.py's, which fuses the same projections in the same order; the
one difference is the checkpoint's spelling, so each fused tensor is cut here into the parts a
Llama checkpoint would hold, and the loader places (and under tensor parallelism shards) each
part as it would a Llama tensor. Rope, longrope included, is model_config.py's."""

import torch

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig


class Phi3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def checkpoint_parts(
        name: str, tensor: torch.Tensor, full: ModelConfig
    ) -> list[tuple[str, torch.Tensor]]:
        """`...self_attn.qkv_proj.weight` as q_proj, k_proj and v_proj, `...mlp.gate_up_proj.weight`
        as gate_proj and up_proj (the whole model's sizes: sharding comes after, per part)."""
        module, _, leaf = name.rpartition(".")
        parent, _, proj = module.rpartition(".")
        if proj == "qkv_proj":
            q, kv = full.num_heads * full.head_dim, full.num_kv_heads * full.head_dim
            sizes = {"q_proj": q, "k_proj": kv, "v_proj": kv}
        elif proj == "gate_up_proj":
            sizes = dict.fromkeys(("gate_proj", "up_proj"), full.intermediate_size)
        else:
            return [(name, tensor)]
        if tensor.shape[0] != sum(sizes.values()):
            raise ModelLoadError(
                f"Weight {name} has {tensor.shape[0]} rows, expected {sum(sizes.values())} "
                f"({' + '.join(f'{p} {n}' for p, n in sizes.items())})"
            )
        parts = tensor.split(list(sizes.values()))
        return [(f"{parent}.{p}.{leaf}", part) for p, part in zip(sizes, parts, strict=True)]
