"""The ModelDeployment CRD: samples are valid, invalid manifests are rejected with the intended
messages, and the schema keeps the conventions the issue asks for."""

import copy
from pathlib import Path

import pytest
import re2
import yaml

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


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            _with(
                {"autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
                | {"autoscaling.minReplicas": 5, "autoscaling.maxReplicas": 2}
            ),
            "minReplicas must not exceed autoscaling.maxReplicas",
        ),
        (_with({"autoscaling.enabled": True}), "needs targetQueueDepth or targetLatencyP95"),
        (_with({"model.source": "s3://bucket/model"}), "source must be hf://org/name"),
        (_with({"model.source": "hf://just-a-name"}), "source must be hf://org/name"),
        (_with({}, name="a" * 41), "metadata.name must be at most 40 characters"),
        (_with({"engine.quantization": "int8"}), "'int8' is not one of"),
        (_with({"replicas": -1}), "-1 is less than the minimum of 0"),
        (_with({"resources.gpus": "1"}), "'1' is not of type 'integer'"),
        (_with({"resources.memory": "lots"}), "does not match"),
    ],
    ids=[
        "min>max",
        "no-target",
        "scheme",
        "hf-no-org",
        "long-name",
        "enum",
        "bound",
        "type",
        "qty",
    ],
)
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
