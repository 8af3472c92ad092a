"""What every rank builds the same way: device and dtype from the settings, the model (its share
under tensor parallelism) with its quantization, and a KV cache block count all ranks agree on."""

import ctypes
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

from kvpilot_common import batch_limits, precision
from kvpilot_common.errors import ConfigError
from kvpilot_common.memory_model import kv_cache_budget
from kvpilot_common.step_memory import step_workspace_bytes
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.distributed.group import TensorParallel, agree_min
from kvpilot_server.engine.distributed.sharding import (
    global_row_absmax,
    row_parallel_linears,
    share_int8_scales,
)
from kvpilot_server.engine.layers import flash_attention, half_matrices, kv_cache
from kvpilot_server.engine.layers.lm_head_quant import quantize_lm_head
from kvpilot_server.engine.layers.quant import check, quantize
from kvpilot_server.engine.lora import layers as lora_layers
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.loader import load_model
from kvpilot_server.engine.models.model_config import ModelConfig

log = logging.getLogger(__name__)


def build_model(
    config: EngineConfig, path: Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel
) -> LlamaForCausalLM:
    half = half_matrices.applies(dtype_name(config.dtype, device), device)
    kept = config.quantization == precision.DEFAULT_QUANTIZATION and not half
    kept = kept and config.lm_head_quantization == precision.DEFAULT_LM_HEAD_QUANTIZATION
    # What this device cannot run is refused before the weights are read, not after.
    check(config.quantization, config.quantization_group_size, device, dtype)
    model = load_model(path, dtype, device, tp, kept)
    shared = config.quantization == "int8" and tp.size > 1
    if shared:
        floats = [getattr(o, n).weight for o, n in row_parallel_linears(model)]
        absmax = global_row_absmax(model, tp)
    # After sharding: each rank quantizes its own slices, scales and groups with them.
    quantize(model, config.quantization, device, config.quantization_group_size)
    if shared:
        share_int8_scales(model, floats, absmax)
    quantize_lm_head(model, config.lm_head_quantization, device)
    if half:
        half_matrices.convert(model)
    if config.enable_lora:  # last: the adapters wrap whatever the base projections became
        model.lora = lora_layers.attach(model, config.max_loras, config.max_lora_rank)
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Hand the host memory that loading freed back to the system. Weights are read in the
    model dtype and then quantized or converted, one matrix at a time; the freed originals are
    heap blocks below glibc's mmap threshold, so they stay in the process as holes that serving
    never reuses (measured: int8 with bfloat16 matrices held more than float32 unquantized until
    trimmed; `kvpilot eval` reports the resident figure). Not glibc (musl, macOS): nothing to do."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def count_blocks(
    config: EngineConfig,
    model: LlamaForCausalLM,
    dtype: torch.dtype,
    device: torch.device,
    tp: TensorParallel,
) -> int:
    """KV blocks this rank's budget holds (kv_cache_bytes on CPU; on a GPU, the fraction of its
    free memory that a step's workspace leaves), the smallest over the ranks: they share one
    block table."""
    per_block = kv_cache.bytes_per_block(
        model.cfg, dtype, device, config.block_size, config.kv_cache_dtype
    )
    if device.type == "cuda":
        # Blocks the caching allocator holds but nothing uses (loading's) are free to the cache.
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
        budget = kv_cache_budget(
            free, workspace(config, model.cfg, dtype), config.kv_cache_memory_fraction
        )
        blocks = budget // per_block
    else:
        blocks = config.kv_cache_bytes // per_block
    return agree_min(blocks, tp)


def workspace(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """A step's transient bytes on this rank (kvpilot_common.step_memory: the same rule
    `kvpilot plan` and the operator's fit check count), from this rank's share of the model."""
    experts = cfg.experts
    mlp = cfg.intermediate_size
    if experts is not None:
        mlp = experts.top_k * experts.width + experts.shared_width
    return step_workspace_bytes(
        hidden=cfg.hidden_size,
        q=cfg.num_heads * cfg.head_dim,
        kv=cfg.num_kv_heads * cfg.head_dim,
        mlp=mlp,
        vocab=cfg.vocab_size,
        item=dtype.itemsize,
        tokens=config.max_num_batched_tokens,
        seqs=config.max_num_seqs,
    )


def cpu_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> ModuleType | None:
    """The compiled decode attention, where it serves: CPU float32, a head dimension of whole
    8-float vectors up to 256 (kernels/csrc/paged_decode.cpp refuses others)."""
    if device.type != "cpu" or dtype != torch.float32 or head_dim % 8 or head_dim > 256:
        return None
    from kvpilot_server.engine.kernels import cpu_kernels

    return cpu_kernels.load()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.version.cuda and _gpu_present():
            # torch says no CUDA, with a GPU in the machine: most often a wheel built for a newer
            # CUDA than the driver runs. Serving on the CPU then is a slow surprise: said aloud.
            log.warning(
                "device auto: this machine has an NVIDIA GPU, but torch %s (built for CUDA %s) "
                "cannot use it, so the model runs on the CPU; a driver older than the wheel's "
                "CUDA is the usual cause (nvidia-smi shows the driver's CUDA version)",
                torch.__version__,
                torch.version.cuda,
            )
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"Unknown device {name!r}: use auto, cpu or cuda[:N]") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"Device {name!r} was asked for, but this machine has no usable CUDA")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"Device type {device.type!r} is not supported: use cpu or cuda")
    return device


def _gpu_present() -> bool:
    """An NVIDIA device node, or a container runtime that was asked for GPUs."""
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    return Path("/dev/nvidia0").exists() or visible not in ("", "void", "none")


def describe_device(device: torch.device) -> str:
    """The device in a start-up line's words: a GPU's name, capability and memory."""
    if device.type != "cuda":
        return str(device)
    total = torch.cuda.get_device_properties(device).total_memory
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    return f"{device} ({name}, compute capability {major}.{minor}, {total / 2**30:.0f} GiB)"


def device_limits(
    device: torch.device, dtype: torch.dtype, cfg: ModelConfig, kv_cache_dtype: str
) -> batch_limits.BatchLimits:
    """The batch limits and block size for settings that name none, from the device
    (kvpilot_common.batch_limits says why): the flash path's pages where it may serve."""
    if device.type != "cuda":
        return batch_limits.defaults(gpu=False)
    quantized = precision.KV_CACHE_DTYPES[kv_cache_dtype].storage is not None
    refused = flash_attention.unusable(
        device, dtype, quantized, cfg.eager_softmax, batch_limits.FLASH_PAGE
    )
    return batch_limits.defaults(
        gpu=True,
        memory=torch.cuda.get_device_properties(device).total_memory,
        name=torch.cuda.get_device_name(device),
        flash=not refused,
    )


def dtype_name(name: str, device: torch.device) -> str:
    """What a dtype setting means on this device: auto resolved (precision.py says why)."""
    amx = device.type == "cpu" and half_matrices.amx_capable()
    return precision.resolve_dtype(name, gpu=device.type == "cuda", amx=amx)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The model's dtype: its activations, norms and KV cache (bfloat16 on CPU keeps those
    float32 and only its matrices bfloat16: engine/layers/half_matrices.py)."""
    name = dtype_name(name, device)
    if half_matrices.applies(name, device):
        if not half_matrices.bfloat16_capable():
            log.warning(
                "this CPU has neither AMX nor AVX-512 bfloat16 dot products: bfloat16 products "
                "are far slower than float32"
            )
        return torch.float32
    if device.type == "cpu" and name != precision.AUTO_DTYPE_CPU:
        log.warning("dtype %s on CPU is usually far slower than float32", name)
    return getattr(torch, name)
