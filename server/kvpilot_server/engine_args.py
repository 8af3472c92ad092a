"""Engine settings as command-line flags, shared by every subcommand that runs the engine."""

import argparse
import dataclasses

from kvpilot_common import batch_limits as limits
from kvpilot_common import precision
from kvpilot_server.config import EngineConfig

_FP8 = f"CUDA, compute capability {precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT}+"
_GROUPS = ", ".join(map(str, precision.INT4_GROUP_SIZES))
_HELP = {
    "model": "builtin://NAME, hf://ORG/NAME or a local Hugging Face checkpoint directory",
    "dtype": "auto (on CPU: bfloat16 where it has AMX, else float32; bfloat16 on CUDA), float32, "
    "bfloat16 (on CPU: bfloat16 matrices, float32 between them; fast with AMX or AVX-512 BF16) "
    "or float16",
    "device": "auto, cpu or cuda[:N]",
    "block_size": f"tokens per KV cache block (default: {limits.SMALL_BLOCK}; on a GPU "
    f"{limits.FLASH_PAGE}, the flash path's pages, for a 16-bit model with an unquantized cache)",
    "kv_cache_bytes": "KV cache size on CPU per tensor-parallel rank: bytes, or with a unit "
    "(512MiB, 4GiB)",
    "kv_cache_memory_fraction": "fraction of free GPU memory for the KV cache on CUDA",
    "max_model_len": "context length limit (default: the model's own)",
    "max_num_seqs": f"most sequences in one step (default: {limits.CPU.max_num_seqs} on CPU, "
    f"{limits.GPU_SEQS} on a GPU)",
    "max_num_batched_tokens": "most tokens in one step, longer prompts prefilled in chunks "
    f"(default: {limits.GPU_TOKENS}; {limits.LARGE_GPU_TOKENS} on a GPU of "
    f"{limits.LARGE_GPU_BYTES >> 30} GiB or more other than an A100)",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "enforce_eager": "CUDA: run every step eagerly instead of replaying decode steps from CUDA "
    "graphs captured per batch size",
    "quantization": "weight quantization: none, int8 or int4 (CPU; int4 decodes against int8 "
    f"activations per block of 32), fp8 ({_FP8})",
    "quantization_group_size": f"int4: weights per scale and minimum ({_GROUPS})",
    "kv_cache_dtype": "KV cache precision: auto (the model dtype), int8 (per-token-per-head "
    f"scales; ~4x the tokens of float32, ~2x of 16-bit) or fp8 ({_FP8})",
    "lm_head_quantization": "lm_head weights: none (the model dtype) or int8 per vocabulary row; "
    "with tied embeddings the embedding lookup reads the same int8 rows",
    "seed": "seed for requests that bring none",
    "tensor_parallel_size": "GPUs (CPU processes) one replica spans, one process each; must "
    "divide the attention heads (default: every visible GPU on CUDA, 1 on CPU)",
    "enable_lora": "serve LoRA adapters (peft's format) beside the base model, each as a model "
    "name of its own; implied by --lora-modules",
    "max_loras": "LoRA adapters one step can mix (slots; more loaded ones wait their turn)",
    "max_lora_rank": "the largest LoRA rank accepted (slots are sized for it)",
    "speculative": "speculative decoding: none, or ngram (draft tokens looked up in the "
    "request's own prompt and output, verified in one forward pass; the output is unchanged)",
    "num_speculative_tokens": "most draft tokens a sequence checks in one step",
    "prompt_lookup_max": "ngram: the longest run of last tokens looked up",
    "prompt_lookup_min": "ngram: the shortest run of last tokens looked up",
    "speculative_disable_by_batch_size": "no draft tokens while more sequences than this run "
    "(large batches are no longer bound by reading the weights)",
    "task": "generate (completions, chat) or embed (/v1/embeddings); auto: embed for a "
    "sentence-transformers checkpoint or a base model without a language-model head",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=_HELP[f.name]
            )
        else:
            kind = int if "int" in str(f.type) else float if "float" in str(f.type) else str
            kind = parse_bytes if f.name.endswith("_bytes") else kind
            group.add_argument(flag, type=kind, default=f.default, help=_HELP[f.name])


_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_bytes(text: str) -> int:
    """'4GiB' -> 4294967296; a plain number is bytes."""
    lowered = text.strip().lower()
    for unit, factor in _UNITS.items():
        if lowered.endswith(unit):
            return int(float(lowered.removesuffix(unit)) * factor)
    return int(lowered)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})
