"""Will the model fit? Checked before any pod is created, so that a spec that cannot run makes
no pods that would only OOM or crash-loop: weights plus a KV cache for at least one sequence of
maxModelLen must fit in one replica's device memory (with tensor parallelism, each GPU's share
in each GPU). A source the operator refuses, and a catalogued model's architecture or a
precision the engine refuses, fail the same way, each with its own reason; status reports it as
Degraded."""

from dataclasses import dataclass
from typing import Any

from kvpilot_common import parallelism, precision
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_common.memory_model import GPU_COMPUTE_CAPABILITY, MiB, unserved
from kvpilot_operator.memory_plan import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    device_memory_bytes,
    replica_plan,
)
from kvpilot_operator.source import problem as source_problem
from kvpilot_operator.spec import Spec


@dataclass(frozen=True)
class Fit:
    fits: bool | None  # None: not checked (model or GPU memory unknown)
    message: str
    capacity: dict[str, Any] | None = None
    reason: str = "InsufficientGPUMemory"  # the Degraded reason when it does not fit


def unsupported_precision(spec: Spec) -> str | None:
    """Why the engine would refuse this spec's FP8 at start, or None. A GPU type the table does
    not know is given the benefit of the doubt (the pod then reports ModelLoadFailed)."""
    engine, resources = spec.engine, spec.resources
    asked_for = (
        ("quantization", engine.quantization, QUANTIZATIONS),
        ("kvCacheDtype", engine.kv_cache_dtype, KV_CACHE_DTYPES),
    )
    fp8 = [f"{field} {value}" for field, value, table in asked_for if table[value].fp8]
    if not fp8:
        return None
    asked = " and ".join(fp8)
    floor = precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT
    if not resources.gpus:
        return f"{asked} needs a GPU of compute capability {floor}+; on CPU use Int8"
    gpu = resources.gpu_type or ""
    capability = GPU_COMPUTE_CAPABILITY.get(gpu)
    if capability is not None and not precision.fp8_capable(capability):
        return (
            f"{asked} needs a GPU of compute capability {floor}+ (L4, L40S, H100, H200); {gpu} is "
            f"{capability[0]}.{capability[1]}: use Int8 or Int4, or a newer GPU type"
        )
    return None


def check(spec: Spec) -> Fit:
    """Whether the spec can be served: a source the operator refuses, and an architecture or a
    precision the engine refuses, fail like a model too big for the GPU, before any pod."""
    source = spec.model.source
    invalid = source_problem(source)
    if invalid:
        return Fit(False, invalid, reason="InvalidModelSource")
    shape, memory = KNOWN_MODELS.get(source), device_memory_bytes(spec)
    # Catalogued models only: another's architecture is known once the pod has downloaded it,
    # and the server then refuses it in the same words (ModelLoadFailed).
    refused = unserved(shape) if shape else None
    if refused:
        return Fit(False, f"{source}: {refused}", reason="UnsupportedArchitecture")
    problem = unsupported_precision(spec)
    if problem:
        return Fit(False, problem, reason="UnsupportedPrecision")
    if shape is None:
        return Fit(None, f"fit not checked: the size of {source} is not known before download")
    refused = parallelism.problem(shape.heads, shape.kv_heads, spec.tensor_parallel_size)
    if refused is not None:
        return Fit(False, f"{source}: {refused}", reason="InvalidTensorParallelSize")
    if memory is None:
        return Fit(None, "fit not checked: set resources.gpuType or resources.gpuMemoryMiB")
    p = replica_plan(spec, shape, memory)
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
    need = (p.weight_bytes + p.adapter_bytes + p.kv_bytes_per_token * p.max_model_len) // MiB
    slots = f"{p.adapter_bytes // MiB} MiB of LoRA adapter slots plus " if p.adapter_bytes else ""
    remedies = "more GPUs per replica, quantization, "
    if p.adapter_bytes:
        remedies += "a smaller maxModelLen, or fewer engine.maxLoras or a lower maxLoraRank"
    else:
        remedies += "or a smaller maxModelLen"
    return Fit(
        False,
        f"{source} needs {p.weight_bytes // MiB} MiB of weights plus {slots}"
        f"{p.kv_bytes_per_token * p.max_model_len // MiB} MiB of KV cache for one "
        f"{p.max_model_len}-token sequence (~{need} MiB before runtime headroom) per device "
        f"over {p.tensor_parallel_size}, but one has {memory // MiB} MiB: use a larger GPU, "
        + remedies,
        capacity,
    )
