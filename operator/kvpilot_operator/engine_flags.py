"""The pod's file layout and the `kvpilot serve` flags a ModelDeployment's spec turns into."""

from kvpilot_common import precision
from kvpilot_common.naming import PORT
from kvpilot_operator.fit import (
    DTYPES,
    KV_CACHE_DTYPES,
    LM_HEAD_QUANTIZATIONS,
    QUANTIZATIONS,
    cpu_kv_cache_bytes,
    tensor_parallel_size,
)
from kvpilot_operator.source import problem, pvc

CACHE_DIR = "/var/cache/kvpilot"  # model cache volume: downloads and converted models
PVC_DIR = "/models"  # where a pvc:// claim is mounted
KEYS_DIR = "/etc/kvpilot/keys"


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


def engine_args(spec: dict, name: str) -> list[str]:
    engine, resources = spec["engine"], spec["resources"]
    args = {
        "--host": "0.0.0.0",
        "--port": str(PORT),
        "--model": model_path(spec["model"]["source"]),
        "--served-model-name": spec["model"].get("servedModelName") or name,
        "--dtype": DTYPES[engine["dtype"]].name,
        "--block-size": str(engine["blockSize"]),
        "--max-num-seqs": str(engine["maxNumSeqs"]),
        "--max-num-batched-tokens": str(engine["maxNumBatchedTokens"]),
        "--max-waiting": str(engine["maxWaitingRequests"]),
        "--drain-timeout": str(spec["probes"]["drainTimeoutSeconds"]),
    }
    if engine.get("maxModelLen"):
        args["--max-model-len"] = str(engine["maxModelLen"])
    if resources["gpus"] or engine.get("tensorParallelSize"):
        # One process per GPU, NCCL between them over the pod's /dev/shm volume (shmMiB).
        args["--tensor-parallel-size"] = str(tensor_parallel_size(spec))
    if resources["gpus"]:
        args["--device"] = "cuda"
        args["--kv-cache-memory-fraction"] = str(engine["kvCacheMemoryPercent"] / 100)
    else:
        args["--device"] = "cpu"
        args["--kv-cache-bytes"] = str(cpu_kv_cache_bytes(spec))
    # Only what differs from the engine's defaults: a pod's flags say what was asked for.
    quantization = QUANTIZATIONS[engine["quantization"]].name
    if quantization != precision.DEFAULT_QUANTIZATION:
        args["--quantization"] = quantization
    if QUANTIZATIONS[engine["quantization"]].grouped:  # int4: its group size
        args["--quantization-group-size"] = str(engine["quantizationGroupSize"])
    kv_cache_dtype = KV_CACHE_DTYPES[engine["kvCacheDtype"]].name
    if kv_cache_dtype != precision.DEFAULT_KV_CACHE_DTYPE:
        args["--kv-cache-dtype"] = kv_cache_dtype
    lm_head = LM_HEAD_QUANTIZATIONS[engine["lmHeadQuantization"]].name
    if lm_head != precision.DEFAULT_LM_HEAD_QUANTIZATION:
        args["--lm-head-quantization"] = lm_head
    if spec.get("auth", {}).get("apiKeySecretRef"):
        args["--api-key-file"] = f"{KEYS_DIR}/{spec['auth']['apiKeySecretRef']['key']}"
    # One word per flag, --flag=value: argparse reads `--served-model-name -x` as two flags and
    # exits (a crash loop), so a value from the spec must never stand alone where it could look
    # like one.
    flat = [f"{flag}={value}" for flag, value in args.items()]
    return flat if engine["enablePrefixCaching"] else [*flat, "--no-enable-prefix-caching"]
