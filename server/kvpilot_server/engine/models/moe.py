"""Mixtures of experts on Llama's attention: Mixtral, Qwen2-MoE and Qwen3-MoE. The decoder is
llama.py's; each sparse layer's MLP is a SparseMoe block (layers/moe.py), and a layer the config
keeps dense (Qwen's `mlp_only_layers`, `decoder_sparse_step`) keeps the dense MLP."""

from torch import nn

from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.layers.moe import SparseMoe
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig

# Mixtral's checkpoints name the block and its experts' projections their own way.
CHECKPOINT_NAMES = (
    (".block_sparse_moe.", ".mlp."),
    (".w1.", ".gate_proj."),
    (".w3.", ".up_proj."),
    (".w2.", ".down_proj."),
)


class MoeForCausalLM(LlamaForCausalLM):
    def build_mlp(self, cfg: ModelConfig, index: int, tp: TensorParallel) -> nn.Module:
        experts = cfg.experts
        if experts is None or not experts.sparse_layers[index]:
            return super().build_mlp(cfg, index, tp)
        return SparseMoe(cfg.hidden_size, experts, tp)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        """A checkpoint tensor's name in this model's (transformers' Qwen) spelling."""
        for old, new in CHECKPOINT_NAMES:
            name = name.replace(old, new)
        return name
