"""The memory model (kvpilot_common.memory_model) applied to one replica of a spec: the memory of
each of its devices, its precision in the engine's names, the plan of weights and KV cache that
follows, and the KV cache a CPU pod is given (its --kv-cache-bytes). The fit check (fit.py) and
the engine flags (engine_flags.py) both read it, so they cannot size a replica differently."""

from lightkube.utils.quantity import parse_quantity

from kvpilot_common import batch_limits, precision
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_common.memory_model import (
    GPU_MEMORY_MIB,
    MiB,
    ModelShape,
    Plan,
    lora_slot_bytes,
    plan,
)
from kvpilot_common.step_memory import GRAPH_SCRATCH_BLOCKS, workspace_of
from kvpilot_operator.spec import Spec

# On CPU the pod's memory limit is the device: the process itself (Python, torch, tokenizer)
# needs some of it besides weights and cache, or the kubelet OOM-kills it.
CPU_HEADROOM_BYTES = 1 << 30
# A CPU pod of a model the memory model does not know still needs a cache: a quarter of its
# memory, never under the smallest that holds a few blocks.
UNKNOWN_MODEL_KV_FRACTION = 4
MIN_KV_CACHE_BYTES = 64 * MiB
# spec.engine's precision fields, CRD spelling -> the engine's rule (its .name is the flag value).
DTYPES = precision.by_crd(precision.DTYPES)
QUANTIZATIONS = precision.by_crd(precision.QUANTIZATIONS)
KV_CACHE_DTYPES = precision.by_crd(precision.KV_CACHE_DTYPES)
LM_HEAD_QUANTIZATIONS = precision.by_crd(precision.LM_HEAD_QUANTIZATIONS)


def device_memory_bytes(spec: Spec) -> int | None:
    """The memory of one device of a replica for its share of weights and cache: one GPU, or
    the pod's memory limit on CPU. None: a GPU whose memory is not known."""
    resources = spec.resources
    if not resources.gpus:
        quantity = parse_quantity(resources.memory)
        assert quantity is not None  # None only for a None input; memory is always set
        return int(quantity)
    mib = resources.gpu_memory_mib or GPU_MEMORY_MIB.get(resources.gpu_type or "")
    return mib * MiB if mib else None


def replica_plan(spec: Spec, shape: ModelShape, memory: int) -> Plan:
    """Weights and KV cache of one replica of `shape` on devices of `memory` bytes each."""
    gpu = spec.resources.gpus > 0
    engine = spec.engine
    dtype = precision.resolve_dtype(DTYPES[engine.dtype].name, gpu)
    slots = lora_slot_bytes(shape, engine.max_loras, engine.max_lora_rank, dtype)
    size = spec.tensor_parallel_size if gpu else 1
    # A GPU engine sizes its cache around a step's workspace; a CPU pod's headroom covers it.
    step = limits(spec, memory, shape.architecture)
    workspace = 0
    if gpu:
        workspace = workspace_of(shape, dtype, step.max_num_batched_tokens, step.max_num_seqs, size)
    return plan(
        shape,
        memory,
        engine.max_model_len or shape.max_position,
        dtype=dtype,
        quantization=QUANTIZATIONS[engine.quantization].name,
        group_size=engine.quantization_group_size,
        kv_cache_dtype=KV_CACHE_DTYPES[engine.kv_cache_dtype].name,
        lm_head_quantization=LM_HEAD_QUANTIZATIONS[engine.lm_head_quantization].name,
        kv_fraction=engine.kv_cache_memory_percent / 100,
        tensor_parallel_size=size,
        adapter_bytes=slots if spec.adapters else 0,
        workspace_bytes=workspace,
        block_size=step.block_size,
        reserved_blocks=GRAPH_SCRATCH_BLOCKS if gpu and not engine.enforce_eager else 0,
        **({} if gpu else {"headroom_bytes": CPU_HEADROOM_BYTES}),
    )


def limits(spec: Spec, memory: int | None, architecture: str = "") -> batch_limits.BatchLimits:
    """The batch limits and block size one replica's engine runs with: the spec's, and for
    what it leaves unset the engine's choice for a device of `memory` bytes (None: unknown)
    and a model of this architecture (config.json's class name; '' when not known)."""
    engine, resources = spec.engine, spec.resources
    gpu = resources.gpus > 0
    return batch_limits.planned(
        gpu=gpu,
        memory=memory,
        name=resources.gpu_type or "",
        dtype=precision.resolve_dtype(DTYPES[engine.dtype].name, gpu),
        kv_cache_dtype=KV_CACHE_DTYPES[engine.kv_cache_dtype].name,
        architecture=architecture,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        block_size=engine.block_size,
    )


def cpu_kv_cache_bytes(spec: Spec) -> int:
    """The --kv-cache-bytes a CPU pod gets: its share of the memory left after the weights."""
    memory = device_memory_bytes(spec) or 0
    shape = KNOWN_MODELS.get(spec.model.source)
    if shape is None:
        return max(MIN_KV_CACHE_BYTES, memory // UNKNOWN_MODEL_KV_FRACTION)
    return max(MIN_KV_CACHE_BYTES, replica_plan(spec, shape, memory).kv_cache_bytes)
