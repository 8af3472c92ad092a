"""Load a Hugging Face checkpoint (config + safetensors) into kvpilot's model; fuse projections."""

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.engine import huge_pages
from kvpilot_server.engine.distributed.group import SINGLE, TensorParallel
from kvpilot_server.engine.distributed.sharding import check, local_config, shard
from kvpilot_server.engine.models import mxfp4
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_server.engine.models.registry import model_class


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    tp: TensorParallel = SINGLE,
    kept: bool = False,
) -> LlamaForCausalLM:
    """The model, or under tensor parallelism rank tp.rank's share of it
    (engine/distributed/sharding.py): each rank reads the checkpoint and keeps only its slices.
    `kept`: the weights will serve as loaded (no quantization or conversion replaces them), so
    on the host they may share one buffer on huge pages (engine/huge_pages.py)."""
    cfg = ModelConfig.from_hf(load_hf_config(path))
    check(cfg, tp.size)
    with torch.device("meta"):
        model = model_class(cfg)(local_config(cfg, tp.size), tp)
    # The dtype first, still on meta: the weights are then allocated once, in their final
    # dtype, on the device (float32 first and a cast after would leave a caching allocator
    # holding the float32 blocks, memory the KV cache is then sized without).
    model.to(dtype)
    model.to_empty(device=device)
    if cfg.tie_word_embeddings or cfg.base_model:  # a base model has no head: it only pools
        model.lm_head.weight = model.embed_tokens.weight
    # Before the weights are first written: huge pages are given at the first touch.
    if kept:
        huge_pages.place(model)
    else:
        huge_pages.advise_module(model)
    tensors = _read_tensors(path)
    if cfg.checkpoint_quantization == "mxfp4":  # the only stored form precision lets through
        tensors = mxfp4.dequantized(tensors, dtype)
    _fill(model, tensors, cfg)
    model.finish_loading()
    return model.eval()


def load_hf_config(path: Path):
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"Cannot read the model config in {path}: {exc}") from exc


_FUSED = ("qkv_proj", "gate_up_proj")


def _slices(cfg: ModelConfig, module: str, param: torch.Tensor) -> dict[str, tuple[int, int]]:
    """For a fused parameter (this rank's share): HF projection -> (row offset, rows).
    gate_up's halves are read off its own shape: experts and shared experts each have their own
    width."""
    if module.endswith("gate_up_proj"):
        half = param.shape[0] // 2
        return {"gate_proj": (0, half), "up_proj": (half, half)}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}


def _fill(
    model: LlamaForCausalLM, tensors: Iterator[tuple[str, torch.Tensor]], full: ModelConfig
) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    slices: dict[str, dict[str, tuple[int, int]]] = {}  # fused module -> its HF parts
    pending = set()
    for name, param in params.items():
        module, _, leaf = name.rpartition(".")
        if module.endswith(_FUSED):
            slices[module] = _slices(model.cfg, module, param)
            pending |= {(name, offset) for offset, _ in slices[module].values()}
        else:
            pending.add((name, 0))
    if model.cfg.tie_word_embeddings or model.cfg.base_model:
        pending.discard(("lm_head.weight", 0))
    with torch.no_grad():
        for hf_name, stored in tensors:
            stored_name = model.checkpoint_name(hf_name.removeprefix("model."))
            # Each part as a Llama checkpoint holds it (models/phi3.py cuts fused tensors).
            for name, part in model.checkpoint_parts(stored_name, stored, full):
                module, _, leaf = name.rpartition(".")
                parent, _, proj = module.rpartition(".")
                tensor = shard(proj, leaf, part, full, model.tp)
                if tensor is None:
                    continue  # a row-parallel bias: rank 0 adds it
                offset, rows = 0, None
                fused = next((f for f in _FUSED if f"{parent}.{f}" in slices), None)
                if fused is not None and proj in slices[f"{parent}.{fused}"]:
                    offset, rows = slices[f"{parent}.{fused}"][proj]
                    name = f"{parent}.{fused}.{leaf}"
                if name not in params:
                    continue  # e.g. rotary inv_freq buffers, or lm_head when tied
                target = params[name] if rows is None else params[name][offset : offset + rows]
                if target.shape != tensor.shape:
                    what = hf_name if part is stored else f"{hf_name}'s {proj} part"
                    raise ModelLoadError(
                        f"Weight {what} has shape {tuple(tensor.shape)}, "
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
