"""Every case of test_crd, sent to the session's real kube-apiserver (the `kube` fixture, the CRD
installed by the chart) as a server-side dry run (nothing is stored, so names repeat) the way
`kubectl apply` sends it: strict field validation, YAML's integral floats as integers.

The API server's answer must be the offline checker's (crd_rules), error for error in its own
words; what it returns for an accepted object must be what crd.with_defaults makes of it; and the
children render() makes of an accepted ModelDeployment must be accepted too: a CRD that lets
through what the Service or the Deployment then refuses fails only later, in the operator."""

import re
from collections.abc import Iterator

import httpx
import pytest
import yaml

from kvpilot_operator import crd, render
from kvpilot_operator.spec import Spec
from kvpilot_testing.crd_rules import as_created, as_sent, errors
from kvpilot_testing.kube.cluster import (
    CONFIGMAPS,
    DEPLOYMENTS,
    MD,
    PDBS,
    SERVICES,
    create_namespace,
)
from tests.operator.crd_cases import (
    ACCEPTED_CASES,
    FIELD_CASES,
    INVALID_CASES,
    SAMPLES,
    SOURCE_CASES,
    amend,
)

NAMESPACE = "crd-verdicts"
DRY_RUN = {"dryRun": "All", "fieldValidation": "Strict"}  # Strict: kubectl's default
CHILDREN = {
    "Deployment": DEPLOYMENTS,
    "Service": SERVICES,
    "PodDisruptionBudget": PDBS,
    "ConfigMap": CONFIGMAPS,
}


def _cases() -> Iterator[object]:
    for sample in SAMPLES:
        yield pytest.param(yaml.safe_load(sample.read_text()), id=f"sample-{sample.stem}")
    for name, obj in ACCEPTED_CASES.items():
        yield pytest.param(obj, id=f"accepted-{name}")
    for name, (obj, _) in INVALID_CASES.items():
        yield pytest.param(obj, id=f"invalid-{name}")
    for i, (field, value, _) in enumerate(FIELD_CASES):
        yield pytest.param(amend({field: value}), id=f"field{i}-{field}")
    for i, (value, _) in enumerate(SOURCE_CASES):
        yield pytest.param(amend({"model.source": value}), id=f"source{i}")


CASES = list(_cases())
ACCEPTED = [p for p in CASES if errors(p.values[0]) == []]


@pytest.fixture(scope="module")
def http(kube) -> Iterator[httpx.Client]:
    """The module's one client (a few ms a request) and its own namespace."""
    create_namespace(kube.plane, NAMESPACE)
    with kube.plane.client() as client:
        yield client
        client.delete(f"/api/v1/namespaces/{NAMESPACE}")


def dry_run(http: httpx.Client, template: str, obj: dict) -> httpx.Response:
    return http.post(template.format(ns=NAMESPACE), params=DRY_RUN, json=obj)


def verdict(response: httpx.Response) -> list[str]:
    """The API server's errors as crd_rules writes them (`<field>: <detail>`); [] if accepted."""
    if response.status_code == 201:
        return []
    status = response.json()
    if response.status_code == 400:  # strict decoding: one message naming every unknown field
        return re.findall(r'unknown field "[^"]*"', status["message"]) or [status["message"]]
    assert response.status_code == 422, status
    return [f"{c.get('field', '<nil>')}: {c['message']}" for c in status["details"]["causes"]]


@pytest.mark.parametrize("obj", CASES)
def test_the_api_server_gives_the_offline_verdict_error_for_error(http, obj):
    found = verdict(dry_run(http, MD, as_sent(obj)))
    assert sorted(found) == sorted(errors(obj))


@pytest.mark.parametrize(("obj", "message"), list(INVALID_CASES.values()), ids=list(INVALID_CASES))
def test_the_api_server_rejects_invalid_manifests_with_the_intended_message(http, obj, message):
    response = dry_run(http, MD, as_sent(obj))
    assert response.status_code in (400, 422)
    assert message in response.json()["message"]


@pytest.mark.parametrize("obj", ACCEPTED)
def test_the_api_server_defaults_as_with_defaults_does(http, obj):
    """Its defaults (of nested objects too), its nulls dropped, its status reset."""
    returned = dry_run(http, MD, as_sent(obj)).raise_for_status().json()
    expected = as_created(as_sent(obj))
    assert {k: v for k, v in returned.items() if k != "metadata"} == {
        k: v for k, v in expected.items() if k != "metadata"
    }


@pytest.mark.parametrize("obj", ACCEPTED)
def test_what_the_crd_accepts_the_children_take(http, obj):
    returned = dry_run(http, MD, as_sent(obj)).raise_for_status().json()
    md = crd.defaulted(returned)
    meta = md["metadata"]
    plan = render.render(meta["name"], meta["namespace"], Spec.from_defaulted(md), "kvpilot:test")
    for child in plan.apply:
        response = dry_run(http, CHILDREN[child["kind"]], child)
        assert response.status_code == 201, (child["kind"], response.json()["message"])


def test_an_integral_float_is_where_kubectl_and_a_json_client_differ(http):
    """Inherent, and why crd_rules turns 2.0 into 2 first: it models kubectl, whose YAML reader
    does. A client that writes JSON's 2.0 (Python's json for a float) passes the schema's
    `type: integer` but is refused where the API server reads an int64: the scale subresource's
    spec.replicas, and every CEL rule that reads the field."""
    obj = ACCEPTED_CASES["integral-float"]  # replicas 2.0, blockSize 32.0
    assert errors(obj) == []
    assert verdict(dry_run(http, MD, obj)) == [
        ".spec.replicas: Invalid value: 0: .spec.replicas accessor error: 2 is of the type "
        "float64, expected int64"
    ]
    scaled = {"autoscaling.enabled": True, "autoscaling.targetQueueDepth": 4}
    obj = amend(scaled | {"autoscaling.minReplicas": 2.0})
    assert errors(obj) == []
    assert verdict(dry_run(http, MD, obj)) == [
        'spec: Invalid value: "object": invalid data, expected int, got float64 evaluating '
        "rule: autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
    ]
