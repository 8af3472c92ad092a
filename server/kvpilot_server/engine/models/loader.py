"""Load a Hugging Face checkpoint (config + safetensors) into kvpilot's model; fuse projections."""

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.engine.distributed.group import SINGLE, TensorParallel
from kvpilot_server.engine.distributed.sharding import check, local_config, shard
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig


def load_model(
    path: Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel = SINGLE
) -> LlamaForCausalLM:
    """The model, or under tensor parallelism rank tp.rank's share of it
    (engine/distributed/sharding.py): each rank reads the checkpoint and keeps only its slices."""
    cfg = ModelConfig.from_hf(load_hf_config(path))
    check(cfg, tp.size)
    with torch.device("meta"):
        model = LlamaForCausalLM(local_config(cfg, tp.size), tp)
    model.to_empty(device=device)
    model.to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    _fill(model, _read_tensors(path), cfg)
    return model.eval()


def load_hf_config(path: Path):
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"Cannot read the model config in {path}: {exc}") from exc


def _shards(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """HF projection name -> (fused parameter, row offset, rows)."""
    q, kv, inter = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    return {
        "q_proj": ("qkv_proj", 0, q),
        "k_proj": ("qkv_proj", q, kv),
        "v_proj": ("qkv_proj", q + kv, kv),
        "gate_proj": ("gate_up_proj", 0, inter),
        "up_proj": ("gate_up_proj", inter, inter),
    }


def _fill(
    model: LlamaForCausalLM, tensors: Iterator[tuple[str, torch.Tensor]], full: ModelConfig
) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    shards = _shards(model.cfg)
    pending = {(name, 0) for name in params}
    for name in list(params):
        module, _, leaf = name.rpartition(".")
        fused = [h for h, (p, _, _) in shards.items() if module.endswith(p)]
        if fused:
            pending.discard((name, 0))
            pending |= {(name, shards[h][1]) for h in fused}
    if model.cfg.tie_word_embeddings:
        pending.discard(("lm_head.weight", 0))
    with torch.no_grad():
        for hf_name, tensor in tensors:
            name = hf_name.removeprefix("model.")
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            tensor = shard(proj, leaf, tensor, full, model.tp)
            if tensor is None:
                continue  # a row-parallel bias: rank 0 adds it
            offset, rows = 0, None
            if proj in shards:
                fused, offset, rows = shards[proj]
                name = f"{parent}.{fused}.{leaf}"
            if name not in params:
                continue  # e.g. rotary inv_freq buffers, or lm_head when tied
            target = params[name] if rows is None else params[name][offset : offset + rows]
            if target.shape != tensor.shape:
                raise ModelLoadError(
                    f"Weight {hf_name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
            pending.discard((name, offset))
    if pending:
        missing = sorted(f"{n}@{o}" if o else n for n, o in pending)
        raise ModelLoadError(f"Checkpoint is missing weights: {', '.join(missing[:8])}")


def _read_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = _safetensor_files(path)
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"Cannot read weights from {file}: {exc}") from exc


def _safetensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"No .safetensors weights in {path}")
    return files
