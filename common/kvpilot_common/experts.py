"""A mixture of experts' shape, as each family's config.json spells it: how many experts, how
many each token uses, how wide each is, whether a shared expert runs beside them, and which
layers are sparse. The one reader of those fields: the engine (engine/layers/moe.py) builds
from it and the memory model counts from it. Standard library only: the operator imports it.

Spellings: Mixtral and gpt-oss size the experts with `intermediate_size` and route every layer;
Qwen2-MoE and Qwen3-MoE size them with `moe_intermediate_size` (`intermediate_size` is then the
dense layers' MLP), choose sparse layers with `decoder_sparse_step` and `mlp_only_layers`, and
Qwen2-MoE adds a shared expert (`shared_expert_intermediate_size`) scaled by a sigmoid gate.
The count is `num_local_experts` or `num_experts`: Qwen's releases say the second, and
transformers 5 saves every family's config with the first. gpt-oss's release says both
`num_experts_per_tok` and `experts_per_token`; transformers 5's GptOssConfig the first.

Routing: Mixtral and Qwen take a softmax over every expert, then the top k (SOFTMAX_TOPK);
gpt-oss takes the top k of the router's logits, then a softmax over those k (TOPK_SOFTMAX):
its weights sum to one by construction, so nothing renormalizes them.
"""

from collections.abc import Mapping
from dataclasses import dataclass

SOFTMAX_TOPK = "softmax_topk"
TOPK_SOFTMAX = "topk_softmax"


@dataclass(frozen=True)
class Experts:
    count: int
    top_k: int
    width: int  # one expert's intermediate size
    shared_width: int  # the shared expert's intermediate size, 0 without one
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP (False)
    normalize_top_k: bool  # renormalize the chosen experts' probabilities to sum to 1
    route: str = SOFTMAX_TOPK  # or TOPK_SOFTMAX (gpt-oss): see the module's docstring

    @property
    def sparse_count(self) -> int:
        return sum(self.sparse_layers)


def from_config(config: Mapping) -> Experts | None:
    """The experts a config.json (a plain dict) describes, or None for a dense model."""
    count = config.get("num_local_experts") or config.get("num_experts") or 0
    if not count:
        return None
    layers = config["num_hidden_layers"]
    if "moe_intermediate_size" not in config:  # Mixtral, gpt-oss: every layer
        gpt_oss = config.get("model_type") == "gpt_oss"
        return Experts(
            count=count,
            top_k=config.get("num_experts_per_tok") or config.get("experts_per_token") or 2,
            width=config["intermediate_size"],
            shared_width=0,
            sparse_layers=(True,) * layers,
            # Dividing gpt-oss's weights by their sum (one, give or take a rounding) would move
            # their last bits away from transformers'.
            normalize_top_k=not gpt_oss,
            route=TOPK_SOFTMAX if gpt_oss else SOFTMAX_TOPK,
        )
    step = config.get("decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or ())
    return Experts(
        count=count,
        top_k=config["num_experts_per_tok"],
        width=config["moe_intermediate_size"],
        shared_width=config.get("shared_expert_intermediate_size") or 0,
        sparse_layers=tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers)),
        normalize_top_k=bool(config.get("norm_topk_prob", False)),
    )
