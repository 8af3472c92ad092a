"""The ModelDeployment CRD: samples are valid, invalid manifests are rejected with the intended
messages, and the schema keeps the conventions the issue asks for."""

import copy
from pathlib import Path

import pytest
import re2
import yaml

from kvpilot_common import parallelism
from kvpilot_common.memory_model import KNOWN_MODELS
from kvpilot_operator import crd, source
from tests.operator.crd_rules import errors, schema_errors

SAMPLES = sorted((Path(__file__).parents[2] / "crds" / "samples").glob("*.yaml"))
BASE = yaml.safe_load(SAMPLES[0].read_text()) if SAMPLES else {}


def _walk(node: dict, path: str = ""):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_samples_are_valid_with_and_without_defaults(sample):
    obj = yaml.safe_load(sample.read_text())
    assert errors(obj) == []
    assert schema_errors(crd.with_defaults(obj)) == []  # defaults must satisfy the schema too


def _with(change: dict, name: str | None = None) -> dict:
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
        _with(
            {"autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
            | {"autoscaling.minReplicas": 5, "autoscaling.maxReplicas": 2}
        ),
        "minReplicas must not exceed autoscaling.maxReplicas",
    ),
    "no-target": (
        _with({"autoscaling.enabled": True}),
        "needs targetQueueDepth or targetLatencyP95",
    ),
    "scheme": (_with({"model.source": "s3://bucket/model"}), "source must be hf://org/name"),
    "hf-no-org": (_with({"model.source": "hf://just-a-name"}), "source must be hf://org/name"),
    "long-name": (_with({}, name="a" * 41), "metadata.name must be at most 40 characters"),
    # The Service is named after the ModelDeployment: a DNS-1035 label, stricter than the
    # subdomain the API server asks of the ModelDeployment's own name.
    "dotted-name": (_with({}, name="qwen2.5-7b"), "metadata.name must be a DNS-1035 label"),
    "digit-name": (_with({}, name="7b"), "metadata.name must be a DNS-1035 label"),
    "upper-name": (_with({}, name="Qwen"), "a lowercase RFC 1123 subdomain must consist"),
    "enum": (_with({"engine.quantization": "int8"}), 'Unsupported value: "int8"'),
    "bound": (_with({"replicas": -1}), "spec.replicas in body should be greater than or equal"),
    "type": (_with({"resources.gpus": "1"}), "spec.resources.gpus in body must be of type integer"),
    "qty": (_with({"resources.memory": "lots"}), "spec.resources.memory in body should match"),
    # kubectl validates strictly by default: a misspelt field fails rather than vanishing.
    "unknown-field": (
        _with({"engine.maxModelLength": 4096}),
        'unknown field "spec.engine.maxModelLength"',
    ),
    # A bound (not a blocking error) lets the CEL rules run and report too...
    "bound+min>max": (
        _with(
            {"replicas": -1, "autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
            | {"autoscaling.minReplicas": 5, "autoscaling.maxReplicas": 2}
        ),
        "minReplicas must not exceed autoscaling.maxReplicas",
    ),
    "tp>gpus": (
        _with({"resources.gpus": 2, "engine.tensorParallelSize": 4}),
        "engine.tensorParallelSize must not exceed resources.gpus",
    ),
    # The 70B model's 64 heads split 1, 2, 4 or 8 ways, not 3: said, or defaulted from gpus.
    "tp-heads": (
        _with(
            {"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 3}
            | {"engine.tensorParallelSize": 3}
        ),
        "must divide the model's attention heads",
    ),
    "tp-heads-from-gpus": (
        _with({"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 6}),
        "must divide the model's attention heads",
    ),
    # ...a wrong enum value (blocking) does not: the rule on the source is not checked.
    "enum+scheme": (
        _with({"engine.quantization": "int8", "model.source": "s3://bucket/model"}),
        "some validation rules were not checked",
    ),
}

# id -> a manifest the API server accepts though it looks wrong; test_crd_apiserver checks each,
# and that the defaults crd.with_defaults fills in are the API server's.
ACCEPTED_CASES: dict[str, dict] = {
    # YAML's `engine:` with every child commented out: null, dropped and defaulted.
    "null-object": _with({"engine": None}),
    "null-fields": _with({"replicas": None, "model.servedModelName": None}),
    "null-label": _with({"scheduling.nodeSelector": {"pool": "gpu", "zone": None}}),
    # On create the status is reset (the status subresource), whatever it held.
    "status": {**_with({}), "status": {"conditions": [{"type": "Ready"}], "replicas": "two"}},
    "generate-name": {**_with({}), "metadata": {"generateName": "smollm2-"}},
    # Fewer GPUs in the replica than the pod gets; a model the CRD does not know (the server
    # checks it at start); CPU processes.
    "tp-under-gpus": _with(
        {"model.source": "hf://meta-llama/Llama-3.1-70B-Instruct", "resources.gpus": 6}
        | {"engine.tensorParallelSize": 4}
    ),
    "tp-unknown-model": _with({"model.source": "hf://org/model", "resources.gpus": 3}),
    "tp-cpu": _with({"resources.gpus": 0, "engine.tensorParallelSize": 3}),
    # kubectl sends YAML's 2.0 as 2.
    "integral-float": _with({"replicas": 2.0, "engine.blockSize": 32.0}),
}


@pytest.mark.parametrize(("obj", "message"), list(INVALID_CASES.values()), ids=list(INVALID_CASES))
def test_invalid_manifests_are_rejected_with_the_intended_message(obj, message):
    found = errors(obj)
    assert any(message in e for e in found), found


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


@pytest.mark.parametrize("obj", list(ACCEPTED_CASES.values()), ids=list(ACCEPTED_CASES))
def test_manifests_that_only_look_wrong_are_accepted(obj):
    assert errors(obj) == []


def test_nulls_are_dropped_then_defaulted():
    spec = crd.with_defaults(ACCEPTED_CASES["null-object"])["spec"]
    assert spec["engine"]["dtype"] == "Auto"
    spec = crd.with_defaults(ACCEPTED_CASES["null-fields"])["spec"]
    assert spec["replicas"] == 1 and "servedModelName" not in spec["model"]
    spec = crd.with_defaults(ACCEPTED_CASES["null-label"])["spec"]
    assert spec["scheduling"]["nodeSelector"] == {"pool": "gpu"}


@pytest.mark.parametrize(("field", "value", "accepted"), FIELD_CASES)
def test_field_rules_accept_and_reject(field, value, accepted):
    found = errors(_with({field: value}))
    assert (found == []) == accepted, found


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


@pytest.mark.parametrize(("value", "accepted"), SOURCE_CASES)
def test_the_crd_and_the_operator_agree_on_model_sources(value, accepted):
    found = errors(_with({"model.source": value}))
    assert (found == []) == accepted, found
    assert (source.problem(value) is None) == accepted


def test_schema_conventions():
    version = crd.crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    assert "status" in version["subresources"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Ready", "Desired", "Queue", "P95", "Age"]
    for path, node in _walk(crd.schema()["properties"]["spec"], "spec"):
        assert node.get("description"), f"{path} has no description"
        assert node.get("type") != "number", f"{path}: no floats in spec, integers with units"
        if "pattern" in node:
            re2.compile(node["pattern"])  # the API server's Go regexp speaks RE2 only


def test_the_crd_knows_the_tensor_parallel_sizes_of_the_catalogued_models():
    """The CEL rule's map of allowed sizes is memory_model's catalogue through parallelism's
    rule: a model added to one and not the other fails here."""
    sizes = {
        source: parallelism.divisors(shape.heads, shape.kv_heads)
        for source, shape in KNOWN_MODELS.items()
    }
    literal = "{" + ", ".join(f"'{s}': {v}" for s, v in sizes.items()) + "}"
    rules = [r["rule"] for r in crd.schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert any(rule.count(literal) == 2 for rule in rules)
