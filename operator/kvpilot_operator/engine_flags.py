"""The pod's file layout and the `kvpilot serve` flags a ModelDeployment's spec turns into."""

from kvpilot_common import adapter_list, precision, speculative
from kvpilot_common.naming import PORT
from kvpilot_operator.memory_plan import (
    DTYPES,
    KV_CACHE_DTYPES,
    LM_HEAD_QUANTIZATIONS,
    QUANTIZATIONS,
    cpu_kv_cache_bytes,
)
from kvpilot_operator.source import problem, pvc
from kvpilot_operator.spec import Spec

CACHE_DIR = "/var/cache/kvpilot"  # model cache volume: downloads and converted models
PVC_DIR = "/models"  # where a pvc:// claim is mounted
KEYS_DIR = "/etc/kvpilot/keys"
ADAPTER_LIST_DIR = "/etc/kvpilot/adapters"  # spec.adapters' list, a ConfigMap (adapters.py)
ADAPTER_CLAIMS_DIR = "/adapters"  # pvc:// adapters' claims, each at /adapters/<claim>


def model_path(source: str) -> str:
    """Where the server finds the weights inside the pod. ValueError for a source the operator
    does not serve, so that no pod is ever rendered with a path outside its volumes."""
    invalid = problem(source)
    if invalid:
        raise ValueError(invalid)
    if source.startswith("hf://"):
        return f"{CACHE_DIR}/models/{source.removeprefix('hf://')}"
    if source.startswith("pvc://"):
        return f"{PVC_DIR}/{pvc(source).path}"
    return source  # builtin:// ships in the image


def engine_args(spec: Spec, name: str) -> list[str]:
    engine, resources = spec.engine, spec.resources
    args = {
        "--host": "0.0.0.0",
        "--port": str(PORT),
        "--model": model_path(spec.model.source),
        "--served-model-name": spec.model.served_model_name or name,
        "--dtype": DTYPES[engine.dtype].name,
        "--max-waiting": str(engine.max_waiting_requests),
        "--drain-timeout": str(spec.probes.drain_timeout_seconds),
    }
    if engine.max_model_len:
        args["--max-model-len"] = str(engine.max_model_len)
    # Unset: the engine chooses from the device it finds (kvpilot_common.batch_limits), the same
    # choice the fit check made from the spec's GPU.
    if engine.block_size:
        args["--block-size"] = str(engine.block_size)
    if engine.max_num_seqs:
        args["--max-num-seqs"] = str(engine.max_num_seqs)
    if engine.max_num_batched_tokens:
        args["--max-num-batched-tokens"] = str(engine.max_num_batched_tokens)
    if resources.gpus or engine.tensor_parallel_size:
        # One process per GPU, NCCL between them over the pod's /dev/shm volume (shmMiB).
        args["--tensor-parallel-size"] = str(spec.tensor_parallel_size)
    if resources.gpus:
        args["--device"] = "cuda"
        args["--kv-cache-memory-fraction"] = str(engine.kv_cache_memory_percent / 100)
    else:
        args["--device"] = "cpu"
        args["--kv-cache-bytes"] = str(cpu_kv_cache_bytes(spec))
    # Only what differs from the engine's defaults: a pod's flags say what was asked for.
    quantization = QUANTIZATIONS[engine.quantization]
    if quantization.name != precision.DEFAULT_QUANTIZATION:
        args["--quantization"] = quantization.name
    if quantization.grouped:  # int4: its group size
        args["--quantization-group-size"] = str(engine.quantization_group_size)
    kv_cache_dtype = KV_CACHE_DTYPES[engine.kv_cache_dtype].name
    if kv_cache_dtype != precision.DEFAULT_KV_CACHE_DTYPE:
        args["--kv-cache-dtype"] = kv_cache_dtype
    lm_head = LM_HEAD_QUANTIZATIONS[engine.lm_head_quantization].name
    if lm_head != precision.DEFAULT_LM_HEAD_QUANTIZATION:
        args["--lm-head-quantization"] = lm_head
    if spec.adapters:  # the server follows the list as it changes (adapters.py)
        args["--lora-config"] = f"{ADAPTER_LIST_DIR}/{adapter_list.FILE_NAME}"
        args["--max-loras"] = str(engine.max_loras)
        args["--max-lora-rank"] = str(engine.max_lora_rank)
    drafts = engine.speculative_decoding
    if drafts is not None and drafts.method != speculative.METHODS[speculative.DEFAULT_METHOD]:
        args["--speculative"] = {crd: name for name, crd in speculative.METHODS.items()}[
            drafts.method
        ]
        args["--num-speculative-tokens"] = str(drafts.num_speculative_tokens)
        args["--prompt-lookup-max"] = str(drafts.prompt_lookup_max)
        args["--prompt-lookup-min"] = str(drafts.prompt_lookup_min)
        args["--speculative-disable-by-batch-size"] = str(drafts.disable_by_batch_size)
    if spec.api_key_secret_ref:
        args["--api-key-file"] = f"{KEYS_DIR}/{spec.api_key_secret_ref.key}"
    # One word per flag, --flag=value: argparse reads `--served-model-name -x` as two flags and
    # exits (a crash loop), so a value from the spec must never stand alone where it could look
    # like one.
    flat = [f"{flag}={value}" for flag, value in args.items()]
    if engine.enforce_eager:
        flat.append("--enforce-eager")
    return flat if engine.enable_prefix_caching else [*flat, "--no-enable-prefix-caching"]
