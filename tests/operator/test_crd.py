"""The ModelDeployment CRD: samples are valid, invalid manifests are rejected with the intended
messages, and the schema keeps the conventions the issue asks for."""

import pytest
import re2
import yaml

from kvpilot_common import parallelism
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_operator import crd, source
from kvpilot_testing.crd_rules import errors, schema_errors
from tests.operator.crd_cases import (
    ACCEPTED_CASES,
    FIELD_CASES,
    INVALID_CASES,
    SAMPLES,
    SOURCE_CASES,
    amend,
)


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


@pytest.mark.parametrize(("obj", "message"), list(INVALID_CASES.values()), ids=list(INVALID_CASES))
def test_invalid_manifests_are_rejected_with_the_intended_message(obj, message):
    found = errors(obj)
    assert any(message in e for e in found), found


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
    found = errors(amend({field: value}))
    assert (found == []) == accepted, found


@pytest.mark.parametrize(("value", "accepted"), SOURCE_CASES)
def test_the_crd_and_the_operator_agree_on_model_sources(value, accepted):
    found = errors(amend({"model.source": value}))
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
