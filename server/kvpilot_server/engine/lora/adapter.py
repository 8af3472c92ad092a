"""A LoRA adapter as peft writes it (adapter_config.json + adapter_model.safetensors), read
into the pieces the engine adds to its fused projections.

Each targeted projection p of layer l contributes `scaling * B @ A` to its weight, A of shape
[r, in] and B of shape [out, r]. The engine fuses q/k/v and gate/up into one linear each, so a
piece names the part it adds to (q_proj, ..., down_proj); an adapter written for a checkpoint
that stores them fused (Phi-3's qkv_proj and gate_up_proj) is cut into the same parts here,
sharing one A. The scaling (lora_alpha / r, or / sqrt(r) with rsLoRA, per module where
alpha_pattern says so) is folded into B once. Under tensor parallelism a rank keeps its slice
exactly as it does of the base weights (engine/distributed/sharding.py): B's rows for
column-parallel parts, A's columns for the row-parallel o_proj and down_proj.

Anything the engine would not apply is refused, naming it, rather than served without it:
DoRA, trained biases, modules_to_save, targets outside the decoder's projections (embeddings,
lm_head, experts), pickled weights.
"""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from kvpilot_common.errors import AdapterError
from kvpilot_server.engine.distributed.group import SINGLE, TensorParallel
from kvpilot_server.engine.distributed.sharding import shard
from kvpilot_server.engine.models.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PARTS = ("gate_proj", "up_proj", "down_proj")
# What a peft key may name: the parts, or the fused modules of a checkpoint that stores them so.
MODULES = {"self_attn": (*ATTENTION_PARTS, "qkv_proj"), "mlp": (*MLP_PARTS, "gate_up_proj")}
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int  # the largest rank of any piece
    # (layer, part) -> (A [r, in], B [out, r] with the scaling folded in), this rank's slices
    pieces: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.pieces.values())


def part_sizes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each part's (in, out) features in the whole model `cfg`."""
    q, kv, hidden, width = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.hidden_size,
        cfg.intermediate_size,
    )
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, width),
        "up_proj": (hidden, width),
        "down_proj": (width, hidden),
    }


def read_config(path: Path) -> dict:
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except FileNotFoundError as exc:
        raise AdapterError(f"{path} holds no {CONFIG_FILE}: not a peft LoRA adapter") from exc
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {path / CONFIG_FILE}: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path / CONFIG_FILE} is not a JSON object")
    problems = {
        "peft_type": config.get("peft_type", "LORA") != "LORA",
        "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none",
        "modules_to_save": bool(config.get("modules_to_save")),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
    }
    for key, bad in problems.items():
        if bad:
            raise AdapterError(f"adapter {path}: {key}={config[key]!r} is not supported")
    return config


def load_adapter(
    name: str,
    path: str | Path,
    full: ModelConfig,
    max_rank: int,
    dense_mlp: bool = True,
    tp: TensorParallel = SINGLE,
) -> LoraAdapter:
    """Read and check the adapter at `path` against the whole base model `full`; raises
    AdapterError saying what does not fit."""
    path = Path(path)
    config = read_config(path)
    if not (path / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{path} holds no {WEIGHTS_FILE} (pickled .bin weights are not read)")
    try:
        tensors = load_file(path / WEIGHTS_FILE)
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"cannot read {path / WEIGHTS_FILE}: {exc}") from exc
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise AdapterError(
                f"adapter {name}: {key} is not a LoRA weight of a decoder projection"
            )
        layer, block, module, side = int(match[1]), match[2], match[3], match[4]
        allowed = MODULES[block]
        if module not in allowed or layer >= full.num_layers:
            raise AdapterError(f"adapter {name}: {key} targets nothing in this model")
        if block == "mlp" and not dense_mlp:
            raise AdapterError(
                f"adapter {name}: {key} targets an MLP, and this model's are experts"
            )
        found.setdefault((layer, module), {})[side] = tensor.float()
    if not found:
        raise AdapterError(f"adapter {name}: {WEIGHTS_FILE} holds no LoRA weights")
    sizes, pieces, rank = part_sizes(full), {}, 0
    for (layer, module), sides in sorted(found.items()):
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"adapter {name}: layer {layer} {module} lacks lora_A or lora_B")
        block = "self_attn" if module in MODULES["self_attn"] else "mlp"
        a, b = (
            sides["A"],
            sides["B"]
            * _scaling(config, f"model.layers.{layer}.{block}.{module}", len(sides["A"])),
        )
        parts = _FUSED.get(module, (module,))
        want_out = sum(sizes[p][1] for p in parts)
        if a.dim() != 2 or b.dim() != 2 or a.shape != (b.shape[1], sizes[parts[0]][0]):
            raise AdapterError(
                f"adapter {name}: layer {layer} {module} has shapes A {tuple(a.shape)}, "
                f"B {tuple(b.shape)}; this model's {module} takes {sizes[parts[0]][0]} inputs"
            )
        if b.shape[0] != want_out:
            raise AdapterError(
                f"adapter {name}: layer {layer} {module} has {b.shape[0]} outputs, this model's "
                f"has {want_out}: it was trained for another base model"
            )
        if len(a) > max_rank:
            raise AdapterError(
                f"adapter {name} has rank {len(a)}, above this server's --max-lora-rank {max_rank}"
            )
        rank = max(rank, len(a))
        for part, b_part in zip(parts, b.split([sizes[p][1] for p in parts]), strict=True):
            # o_proj and down_proj split A's columns (their inputs), the others B's rows.
            pieces[(layer, part)] = (
                shard(part, "weight", a, full, tp) if part in ("o_proj", "down_proj") else a,
                b_part
                if part in ("o_proj", "down_proj")
                else shard(part, "weight", b_part, full, tp),
            )
    return LoraAdapter(name, str(path), rank, pieces)


def _scaling(config: dict, module: str, rank: int) -> float:
    """peft's lora_alpha / r (/ sqrt(r) with rsLoRA), alpha from the first alpha_pattern key
    that names this module."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            alpha = value
            break
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
