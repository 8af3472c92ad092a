"""Will the model fit? The memory model applied to a spec before any pod is created: weights plus
a KV cache for at least one sequence of maxModelLen must fit in one replica's device memory (with
tensor parallelism, each GPU's share in each GPU). And how much disk its model cache may take."""

import math
from dataclasses import dataclass
from typing import Any

from lightkube.utils.quantity import parse_quantity

from kvpilot_common import parallelism, precision
from kvpilot_common.memory_model import (
    GPU_COMPUTE_CAPABILITY,
    GPU_MEMORY_MIB,
    KNOWN_MODELS,
    GiB,
    MiB,
    ModelShape,
    plan,
)
from kvpilot_operator.source import problem as source_problem

CPU_HEADROOM_BYTES = 1 << 30
# spec.engine's precision fields, CRD spelling -> the engine's rule (its .name is the flag value).
DTYPES = precision.by_crd(precision.DTYPES)
QUANTIZATIONS = precision.by_crd(precision.QUANTIZATIONS)
KV_CACHE_DTYPES = precision.by_crd(precision.KV_CACHE_DTYPES)
LM_HEAD_QUANTIZATIONS = precision.by_crd(precision.LM_HEAD_QUANTIZATIONS)
# The model cache volume's size limit (an emptyDir's sizeLimit: the kubelet evicts the pod that
# writes more, rather than a runaway download filling the node's disk and evicting others).
# Derived from the model, not one default, because a 135M and a 70B model differ 500-fold. On disk
# a checkpoint takes at most 4 bytes per parameter: float32 (the builtin model is converted to
# it), or 16 bits shipped twice (Llama's original/, Mistral's consolidated.safetensors; `hf
# download` fetches the whole repository). A quarter more and 2 GiB cover tokenizers, metadata
# and the HF cache. resources.modelCacheGiB overrides it, e.g. for a large uncatalogued model.
CHECKPOINT_BYTES_PER_PARAM = 4
CACHE_SLACK = 1.25
CACHE_BASE_BYTES = 2 * GiB  # also all a pvc:// pod's cache holds: its weights stay on the claim
UNKNOWN_MODEL_CACHE_GIB = 100  # an hf:// model the memory model does not know (~20B parameters)


@dataclass(frozen=True)
class Fit:
    fits: bool | None  # None: not checked (model or GPU memory unknown)
    message: str
    capacity: dict[str, Any] | None = None
    reason: str = "InsufficientGPUMemory"  # the Degraded reason when it does not fit


def _dtype(spec: dict) -> str:
    gpu = spec["resources"]["gpus"] > 0
    return precision.resolve_dtype(DTYPES[spec["engine"]["dtype"]].name, gpu)


def _max_len(spec: dict, shape: ModelShape) -> int:
    return spec["engine"].get("maxModelLen") or shape.max_position


def tensor_parallel_size(spec: dict) -> int:
    """GPUs one replica spans: engine.tensorParallelSize, by default every GPU the pod gets."""
    return spec["engine"].get("tensorParallelSize") or max(1, spec["resources"]["gpus"])


def device_memory_bytes(spec: dict) -> int | None:
    """The memory of one device of a replica for its share of weights and cache: one GPU, or
    the pod's memory limit on CPU."""
    resources = spec["resources"]
    if not resources["gpus"]:
        return int(parse_quantity(resources["memory"]))
    mib = resources.get("gpuMemoryMiB") or GPU_MEMORY_MIB.get(resources.get("gpuType", ""))
    return mib * MiB if mib else None


def _plan(spec: dict, shape: ModelShape, memory: int):
    gpu = spec["resources"]["gpus"] > 0
    engine = spec["engine"]
    return plan(
        shape,
        memory,
        _max_len(spec, shape),
        dtype=_dtype(spec),
        quantization=QUANTIZATIONS[engine["quantization"]].name,
        group_size=engine["quantizationGroupSize"],
        kv_cache_dtype=KV_CACHE_DTYPES[engine["kvCacheDtype"]].name,
        lm_head_quantization=LM_HEAD_QUANTIZATIONS[engine["lmHeadQuantization"]].name,
        kv_fraction=engine["kvCacheMemoryPercent"] / 100,
        tensor_parallel_size=tensor_parallel_size(spec) if gpu else 1,
        **({} if gpu else {"headroom_bytes": CPU_HEADROOM_BYTES}),
    )


def unsupported_precision(spec: dict) -> str | None:
    """Why the engine would refuse this spec's FP8 at start, or None. A GPU type the table does
    not know is given the benefit of the doubt (the pod then reports ModelLoadFailed)."""
    engine, resources = spec["engine"], spec["resources"]
    fields = (("quantization", QUANTIZATIONS), ("kvCacheDtype", KV_CACHE_DTYPES))
    fp8 = [field for field, table in fields if table[engine[field]].fp8]
    if not fp8:
        return None
    asked = " and ".join(f"{field} {engine[field]}" for field in fp8)
    floor = precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT
    if not resources["gpus"]:
        return f"{asked} needs a GPU of compute capability {floor}+; on CPU use Int8"
    gpu = resources.get("gpuType", "")
    capability = GPU_COMPUTE_CAPABILITY.get(gpu)
    if capability is not None and not precision.fp8_capable(capability):
        return (
            f"{asked} needs a GPU of compute capability {floor}+ (L4, L40S, H100, H200); {gpu} is "
            f"{capability[0]}.{capability[1]}: use Int8 or Int4, or a newer GPU type"
        )
    return None


def check(spec: dict) -> Fit:
    """Whether the spec can be served: a source the operator refuses and a precision the engine
    refuses fail like a model too big for the GPU, before any pod."""
    source = spec["model"]["source"]
    invalid = source_problem(source)
    if invalid:
        return Fit(False, invalid, reason="InvalidModelSource")
    problem = unsupported_precision(spec)
    if problem:
        return Fit(False, problem, reason="UnsupportedPrecision")
    shape, memory = KNOWN_MODELS.get(source), device_memory_bytes(spec)
    if shape is None:
        return Fit(None, f"fit not checked: the size of {source} is not known before download")
    size = tensor_parallel_size(spec)
    refused = parallelism.problem(shape.heads, shape.kv_heads, size)
    if refused is not None:
        return Fit(False, f"{source}: {refused}", reason="InvalidTensorParallelSize")
    if memory is None:
        return Fit(None, "fit not checked: set resources.gpuType or resources.gpuMemoryMiB")
    p = _plan(spec, shape, memory)
    capacity = {
        "tensorParallelSize": p.tensor_parallel_size,  # the MiB figures are per GPU
        "weightsMiB": p.weight_bytes // MiB,
        "kvCacheMiB": max(0, p.kv_cache_bytes) // MiB,
        "kvCacheTokens": p.kv_tokens,
        "maxModelLen": p.max_model_len,
        "sequencesAtMaxModelLen": p.sequences_at_max_len,
    }
    if p.fits:
        return Fit(
            True, f"{p.sequences_at_max_len} sequences of {p.max_model_len} tokens fit", capacity
        )
    need = (p.weight_bytes + p.kv_bytes_per_token * p.max_model_len) // MiB
    return Fit(
        False,
        f"{source} needs {p.weight_bytes // MiB} MiB of weights plus "
        f"{p.kv_bytes_per_token * p.max_model_len // MiB} MiB of KV cache for one "
        f"{p.max_model_len}-token sequence (~{need} MiB before runtime headroom) per device "
        f"over {p.tensor_parallel_size}, but one has {memory // MiB} MiB: use a larger GPU, "
        "more GPUs per replica, quantization, or a smaller maxModelLen",
        capacity,
    )


def cpu_kv_cache_bytes(spec: dict) -> int:
    """The --kv-cache-bytes a CPU pod gets: its share of the memory left after the weights."""
    memory = device_memory_bytes(spec) or 0
    shape = KNOWN_MODELS.get(spec["model"]["source"])
    if shape is None:
        return max(64 * MiB, memory // 4)
    return max(64 * MiB, _plan(spec, shape, memory).kv_cache_bytes)


def model_cache_gib(spec: dict) -> int:
    """The model cache volume's size limit in GiB (see CHECKPOINT_BYTES_PER_PARAM)."""
    source = spec["model"]["source"]
    if spec["resources"].get("modelCacheGiB"):
        return spec["resources"]["modelCacheGiB"]
    if source.startswith("pvc://"):
        return CACHE_BASE_BYTES // GiB
    shape = KNOWN_MODELS.get(source)
    if shape is None:
        return UNKNOWN_MODEL_CACHE_GIB
    checkpoint = shape.params * CHECKPOINT_BYTES_PER_PARAM * CACHE_SLACK
    return math.ceil((checkpoint + CACHE_BASE_BYTES) / GiB)
