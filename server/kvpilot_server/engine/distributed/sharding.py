"""A rank's part of a tensor-parallel model: its slice of each checkpoint tensor, and the one
all-reduce after each row-parallel projection.

Column-parallel (each rank a slice of the output rows): the fused qkv projection (its query
heads and KV heads, kvpilot_common.parallelism says which) and the fused gate/up projection
(its columns of the intermediate size), and with them gpt-oss's attention sinks, one per query
head, and the experts' gate and up biases. Row-parallel (each rank a slice of the input columns):
o_proj and down_proj, whose partial sums one all-reduce adds up. Their biases are added on rank
0 alone, so the sum counts them once. Norms, the embedding and lm_head are replicated: sampling
needs every logit on rank 0 anyway, so a vocabulary-parallel lm_head would add an all-gather
of the logits per step, and an embedding split would add an all-reduce, to save the tables'
memory on the other ranks (the memory model counts them on every GPU).

Quantization runs after sharding, on each rank's own slices, so scales and int4 groups shard
with their weights: column-parallel rows keep exactly their single-GPU scales, and int4 groups
never straddle two ranks (quant.quantize refuses a group size that does not divide a rank's
columns). Row-parallel int8 rows get the scale of the whole row (share_int8_scales), so int8 at
N ranks equals int8 at one; fp8's row-parallel scales (CUDA only) stay per rank.
"""

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from kvpilot_common import parallelism
from kvpilot_common.errors import ConfigError
from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.layers.quant import decoder_linears, quantize_int8
from kvpilot_server.engine.models.model_config import ModelConfig

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


def check(cfg: ModelConfig, size: int) -> None:
    """Refuse at start, in words, a size that cannot split this model."""
    why = parallelism.problem(cfg.num_heads, cfg.num_kv_heads, size)
    widths = {"MLP's": cfg.intermediate_size}
    if cfg.experts is not None:
        widths["experts'"] = cfg.experts.width
        widths["shared expert's"] = cfg.experts.shared_width
    for what, columns in widths.items():
        if why is None and columns % size:
            why = f"tensor parallel size {size} does not divide the {what} {columns} columns"
    if why is not None:
        raise ConfigError(why)


def local_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The model one rank holds: a Llama with fewer heads and a narrower MLP (narrower experts:
    layers/moe.py says why a slice of each), so the model, its KV cache and the loader's fused
    offsets need no other change."""
    experts = cfg.experts
    if experts is not None:
        experts = dataclasses.replace(
            experts, width=experts.width // size, shared_width=experts.shared_width // size
        )
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // size,
        num_kv_heads=parallelism.kv_heads_per_rank(cfg.num_kv_heads, size),
        intermediate_size=cfg.intermediate_size // size,
        experts=experts,
    )


def shard(proj: str, leaf: str, tensor: torch.Tensor, cfg: ModelConfig, tp: TensorParallel):
    """This rank's part of the checkpoint tensor `<proj>.<leaf>` of the full model `cfg`; None
    when the rank holds none of it (a row-parallel bias off rank 0)."""
    if tp.size == 1:
        return tensor
    if leaf == "sinks":  # gpt-oss: one per query head, which q_proj's rows split as these do
        return tensor.chunk(tp.size)[tp.rank]
    if proj not in _COLUMN + _ROW:
        return tensor
    if proj in _ROW:
        if leaf == "bias":
            return tensor if tp.rank == 0 else None
        return tensor.chunk(tp.size, dim=1)[tp.rank]
    if proj in ("q_proj", "gate_proj", "up_proj"):
        return tensor.chunk(tp.size, dim=0)[tp.rank]
    count = parallelism.kv_heads_per_rank(cfg.num_kv_heads, tp.size)
    start = parallelism.kv_head_start(cfg.num_kv_heads, tp.size, tp.rank)
    return tensor[start * cfg.head_dim : (start + count) * cfg.head_dim]


def row_parallel_linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(owner, name) for owner, name in decoder_linears(model) if name in _ROW]


def global_row_absmax(model: nn.Module, tp: TensorParallel) -> list[torch.Tensor]:
    """Per row-parallel layer, each output row's largest |weight| over every rank's columns."""
    found = []
    for owner, name in row_parallel_linears(model):
        absmax = getattr(owner, name).weight.detach().abs().amax(dim=1).float()
        dist.all_reduce(absmax, op=dist.ReduceOp.MAX, group=tp.group)
        found.append(absmax)
    return found


def share_int8_scales(
    model: nn.Module, floats: list[torch.Tensor], absmax: list[torch.Tensor]
) -> None:
    """Give the row-parallel int8 layers the scale per output row the whole row gets at one
    rank, so int8 at N ranks computes what int8 at one does (a per-rank scale would be finer
    but different). quant.quantize_int8 stays the one rule: quantizing the rank's columns
    beside one more column holding the row's global absmax yields exactly that scale."""
    layers = row_parallel_linears(model)
    for (owner, name), weight, peak in zip(layers, floats, absmax, strict=True):
        layer = getattr(owner, name)
        q, scale = quantize_int8(torch.cat((weight.float(), peak[:, None].to(weight.device)), 1))
        layer.weight = q[:, :-1].contiguous()
        layer.scale = scale
