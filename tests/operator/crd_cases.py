"""The ModelDeployment cases the CRD's tests share: the samples, and manifests the API server
rejects (with the message it must give), accepts though they look wrong, or decides field by
field. test_crd checks them offline (kvpilot_testing.crd_rules), test_crd_apiserver against a
real API server, test_rendered_args through render() to the server's flags."""

import copy
from pathlib import Path

import yaml

SAMPLES = sorted((Path(__file__).parents[2] / "crds" / "samples").glob("*.yaml"))
BASE = yaml.safe_load(SAMPLES[0].read_text()) if SAMPLES else {}


def amend(change: dict, name: str | None = None) -> dict:
    """A copy of the first sample with `change` (dotted paths under spec) made, and `name`."""
    obj = copy.deepcopy(BASE)
    if name:
        obj["metadata"]["name"] = name
    for dotted, value in change.items():
        *parents, leaf = dotted.split(".")
        node = obj["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return obj


# id -> (an invalid manifest, a part of the message it must be rejected with): the CRD's own
# message for its CEL rules, the API server's words for the rest (crd_rules speaks them).
# test_crd_apiserver sends each to a real API server.
INVALID_CASES: dict[str, tuple[dict, str]] = {
    "min>max": (
        amend(
            {"autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
            | {"autoscaling.minReplicas": 5, "autoscaling.maxReplicas": 2}
        ),
        "minReplicas must not exceed autoscaling.maxReplicas",
    ),
    "no-target": (
        amend({"autoscaling.enabled": True}),
        "needs targetQueueDepth or targetLatencyP95",
    ),
    "scheme": (amend({"model.source": "s3://bucket/model"}), "source must be hf://org/name"),
    "hf-no-org": (amend({"model.source": "hf://just-a-name"}), "source must be hf://org/name"),
    "long-name": (amend({}, name="a" * 41), "metadata.name must be at most 40 characters"),
    # The Service is named after the ModelDeployment: a DNS-1035 label, stricter than the
    # subdomain the API server asks of the ModelDeployment's own name.
    "dotted-name": (amend({}, name="qwen2.5-7b"), "metadata.name must be a DNS-1035 label"),
    "digit-name": (amend({}, name="7b"), "metadata.name must be a DNS-1035 label"),
    "upper-name": (amend({}, name="Qwen"), "a lowercase RFC 1123 subdomain must consist"),
    "enum": (amend({"engine.quantization": "int8"}), 'Unsupported value: "int8"'),
    "bound": (amend({"replicas": -1}), "spec.replicas in body should be greater than or equal"),
    "type": (amend({"resources.gpus": "1"}), "spec.resources.gpus in body must be of type integer"),
    "qty": (amend({"resources.memory": "lots"}), "spec.resources.memory in body should match"),
    # kubectl validates strictly by default: a misspelt field fails rather than vanishing.
    "unknown-field": (
        amend({"engine.maxModelLength": 4096}),
        'unknown field "spec.engine.maxModelLength"',
    ),
    # A bound (not a blocking error) lets the CEL rules run and report too...
    "bound+min>max": (
        amend(
            {"replicas": -1, "autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
            | {"autoscaling.minReplicas": 5, "autoscaling.maxReplicas": 2}
        ),
        "minReplicas must not exceed autoscaling.maxReplicas",
    ),
    "tp>gpus": (
        amend({"resources.gpus": 2, "engine.tensorParallelSize": 4}),
        "engine.tensorParallelSize must not exceed resources.gpus",
    ),
    # The 70B model's 64 heads split 1, 2, 4 or 8 ways, not 3: said, or defaulted from gpus.
    "tp-heads": (
        amend(
            {"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 3}
            | {"engine.tensorParallelSize": 3}
        ),
        "must divide the model's attention heads",
    ),
    "tp-heads-from-gpus": (
        amend({"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 6}),
        "must divide the model's attention heads",
    ),
    "lookup-min>max": (
        amend({"engine.speculativeDecoding": {"method": "Ngram", "promptLookupMin": 5}}),
        "promptLookupMin must not exceed promptLookupMax",
    ),
    # ...a wrong enum value (blocking) does not: the rule on the source is not checked.
    "enum+scheme": (
        amend({"engine.quantization": "int8", "model.source": "s3://bucket/model"}),
        "some validation rules were not checked",
    ),
}

# id -> a manifest the API server accepts though it looks wrong; test_crd_apiserver checks each,
# and that the defaults crd.with_defaults fills in are the API server's.
ACCEPTED_CASES: dict[str, dict] = {
    # YAML's `engine:` with every child commented out: null, dropped and defaulted.
    "null-object": amend({"engine": None}),
    "null-fields": amend({"replicas": None, "model.servedModelName": None}),
    "null-label": amend({"scheduling.nodeSelector": {"pool": "gpu", "zone": None}}),
    # On create the status is reset (the status subresource), whatever it held.
    "status": {**amend({}), "status": {"conditions": [{"type": "Ready"}], "replicas": "two"}},
    "generate-name": {**amend({}), "metadata": {"generateName": "smollm2-"}},
    # Fewer GPUs in the replica than the pod gets; a model the CRD does not know (the server
    # checks it at start); CPU processes.
    "tp-under-gpus": amend(
        {"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 6}
        | {"engine.tensorParallelSize": 4}
    ),
    "tp-unknown-model": amend({"model.source": "hf://org/model", "resources.gpus": 3}),
    "tp-cpu": amend({"resources.gpus": 0, "engine.tensorParallelSize": 3}),
    # kubectl sends YAML's 2.0 as 2.
    "integral-float": amend({"replicas": 2.0, "engine.blockSize": 32.0}),
}


# (field under spec, value, accepted): rules on user input, each both ways.
FIELD_CASES = [
    ("model.servedModelName", "Qwen/Qwen2.5-7B-Instruct", True),
    ("model.servedModelName", "meta-llama/Llama-3.1-8B-Instruct", True),
    ("model.servedModelName", "my-model:v2", True),
    ("model.servedModelName", "org/model@v1+cpu_2", True),
    ("model.servedModelName", "a" * 256, True),
    ("model.servedModelName", "-model", False),
    ("model.servedModelName", "--help", False),
    ("model.servedModelName", ".hidden", False),
    ("model.servedModelName", "my model", False),
    ("model.servedModelName", "model\n", False),
    ("model.servedModelName", "", False),
    ("model.servedModelName", "a" * 257, False),
    ("resources.memory", "999999999.999Ti", True),
    ("resources.memory", "1.5Gi", True),
    ("resources.memory", "99999999999999999999999Ti", False),  # passed once; fit.py then crashed
    ("resources.memory", "1.2345Gi", False),
    ("resources.modelCacheGiB", 1, True),
    ("resources.modelCacheGiB", 500, True),
    ("resources.modelCacheGiB", 0, False),
    ("resources.modelCacheGiB", "100Gi", False),
    ("resources.modelCacheGiB", 65537, False),
    *[
        ("auth.apiKeySecretRef", {"name": "keys", "key": key}, accepted)
        for key, accepted in [
            ("api-keys", True),
            ("keys.txt", True),
            (".hidden", True),
            ("a_b-C.9", True),
            ("k" * 253, True),
            (".", False),
            ("..", False),
            ("..keys", False),
            ("../keys", False),
            ("dir/keys", False),
            ("", False),
            ("my keys", False),
            ("keys\n", False),
            ("k" * 254, False),
        ]
    ],
    ("model.tokenSecretRef", {"name": "hf-token", "key": "token"}, True),
    ("model.tokenSecretRef", {"name": "hf-token", "key": "../token"}, False),
]


# The CRD's rule and the operator's own check (for servers where CEL does not run) must agree.
SOURCE_CASES = [
    ("pvc://model-store/llama-3.1-8b-instruct", True),
    ("pvc://store/models/Qwen2.5-7B-Instruct", True),
    ("pvc://store/runs/lr=1e-5,bs=32/step_1000", True),
    ("pvc://store/a/.cache/b", True),
    ("hf://Qwen/Qwen2.5-7B-Instruct", True),
    ("builtin://smollm2-135m-instruct", True),
    ("pvc://store/../..", False),
    ("pvc://store/models/../../etc", False),
    ("pvc://store/..", False),
    ("pvc://store/./model", False),
    ("pvc://store/...", False),
    ("pvc://store/a//b", False),
    ("pvc://store//abs", False),
    ("pvc://store/model/", False),
    ("pvc://store/", False),
    ("pvc://store", False),
    ("pvc://store/my model", False),
    ("pvc://store/a\tb", False),
    ("pvc://store/model\n", False),
    ("pvc://store/a\x00b", False),
    ("pvc://store/a\x7fb", False),
    ("pvc://Store/model", False),
    ("hf://org/..", False),
    ("s3://bucket/model", False),
]
