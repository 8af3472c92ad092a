"""`kvpilot plan`: will a model fit, and how many sequences will its KV cache hold? The memory
model (kvpilot_common.memory_model) applied to a model and a device, without loading anything.
It plans for architectures the engine does not serve too, and says so (`servable`)."""

import argparse
import json
from pathlib import Path

from kvpilot_common import batch_limits, parallelism, precision
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_common.memory_model import (
    GPU_MEMORY_MIB,
    MiB,
    ModelShape,
    plan,
    shape_from_config,
    unserved,
)
from kvpilot_common.naming import BUNDLED_MODEL
from kvpilot_common.step_memory import GRAPH_SCRATCH_BLOCKS, workspace_of
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine_args import parse_bytes

DEFAULT_GPU = "H100-80GB"  # what a plan names no device for


def add_plan_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=BUNDLED_MODEL,
        help="a known source (builtin://, catalogued hf://) or a directory with config.json",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu-memory", type=parse_bytes, help="device memory, e.g. 80GiB")
    where.add_argument("--gpu-type", choices=sorted(GPU_MEMORY_MIB), help="a known GPU")
    # No auto: nothing says which device auto would resolve on; plans are for GPUs.
    parser.add_argument("--dtype", default=precision.AUTO_DTYPE_GPU, choices=precision.SIZED_DTYPES)
    parser.add_argument(
        "--quantization",
        default=precision.DEFAULT_QUANTIZATION,
        choices=list(precision.QUANTIZATIONS),
    )
    parser.add_argument(
        "--quantization-group-size",
        type=int,
        default=precision.INT4_DEFAULT_GROUP_SIZE,
        choices=precision.INT4_GROUP_SIZES,
        help="int4 only",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default=precision.DEFAULT_KV_CACHE_DTYPE,
        choices=list(precision.KV_CACHE_DTYPES),
    )
    parser.add_argument(
        "--lm-head-quantization",
        default=precision.DEFAULT_LM_HEAD_QUANTIZATION,
        choices=list(precision.LM_HEAD_QUANTIZATIONS),
        help="int8: lm_head (and tied embeddings) at one byte per weight",
    )
    parser.add_argument("--max-model-len", type=int, help="default: the model's own limit")
    parser.add_argument(
        "--kv-cache-memory-fraction", type=float, default=EngineConfig.kv_cache_memory_fraction
    )
    # What a step's workspace is sized for (kvpilot_common.step_memory): the engine's limits,
    # by default the ones the engine would choose on this GPU (kvpilot_common.batch_limits).
    parser.add_argument(
        "--max-num-batched-tokens", type=int, help="default: the engine's for this GPU"
    )
    parser.add_argument("--max-num-seqs", type=int, help="default: the engine's for this GPU")
    parser.add_argument(
        "--block-size",
        type=int,
        help="default: the engine's for this GPU (the cache is whole blocks)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs, so no scratch block kept out of the cache",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs one replica spans: weights and KV cache are per GPU, tokens per replica",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")


def model_shape(model: str) -> ModelShape:
    if model in KNOWN_MODELS:
        return KNOWN_MODELS[model]
    config = Path(model) / "config.json"
    if not config.is_file():
        known = ", ".join(sorted(KNOWN_MODELS))
        raise SystemExit(f"kvpilot plan: {model!r} is neither known ({known}) nor a directory")
    try:
        return shape_from_config(json.loads(config.read_text()))
    except KeyError as missing:
        raise SystemExit(f"kvpilot plan: {config} has no {missing}") from None


def run_plan(args: argparse.Namespace) -> int:
    shape = model_shape(args.model)
    size = args.tensor_parallel_size
    refused = parallelism.problem(shape.heads, shape.kv_heads, size)
    if refused is not None:
        raise SystemExit(f"kvpilot plan: {args.model}: {refused}")
    gpu_type = args.gpu_type or ("" if args.gpu_memory else DEFAULT_GPU)
    memory = args.gpu_memory or GPU_MEMORY_MIB[gpu_type] * MiB
    max_len = args.max_model_len or shape.max_position
    limits = batch_limits.planned(
        gpu=True,
        memory=memory,
        name=gpu_type,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        architecture=shape.architecture,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
    )
    workspace = workspace_of(
        shape, args.dtype, limits.max_num_batched_tokens, limits.max_num_seqs, size
    )
    p = plan(
        shape,
        memory,
        max_len,
        dtype=args.dtype,
        quantization=args.quantization,
        group_size=args.quantization_group_size,
        lm_head_quantization=args.lm_head_quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_fraction=args.kv_cache_memory_fraction,
        tensor_parallel_size=size,
        workspace_bytes=workspace,
        block_size=limits.block_size,
        # The engine keeps these out of its pool where it may replay CUDA graphs.
        reserved_blocks=0 if args.enforce_eager else GRAPH_SCRATCH_BLOCKS,
    )
    problem = unserved(shape)
    result = {
        "model": args.model,
        "architecture": shape.architecture,
        "servable": problem is None,  # whether this kvpilot's engine loads it
        **({"unservable_reason": problem} if problem else {}),
        "parameters": shape.params,  # every expert's: all are in memory
        "active_parameters": shape.active_params,  # what one token uses
        **(
            {"experts": shape.experts.count, "experts_per_token": shape.experts.top_k}
            if shape.experts
            else {}
        ),
        "tensor_parallel_size": size,
        # The engine's limits the workspace is sized for, and the block the cache is counted in.
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "block_size": limits.block_size,
        "device_memory_mib": memory // MiB,  # this and the next three: per GPU
        "weights_mib": p.weight_bytes // MiB,
        "step_workspace_mib": workspace // MiB,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "kv_cache_mib": max(0, p.kv_cache_bytes) // MiB,
        "kv_cache_tokens": p.kv_tokens,
        "max_model_len": max_len,
        "sequences_at_max_model_len": p.sequences_at_max_len,
        "fits": p.fits,
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:28} {value}")
    else:
        print(json.dumps(result))
    return 0 if p.fits else 1
