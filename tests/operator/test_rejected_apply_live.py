"""A spec the CRD accepts but the API server's Deployment validation refuses, against the real
API server and the real operator: Degraded=True InvalidPodSpec in the API server's own words,
Warning Events once (not one per retry), no Deployment or Service, one apply attempt and no
traceback instead of a retry every 5 s. Changed to another refused spec (a misspelt toleration
key, which server-side apply answers with a 500), one Event more; then fixed (a new generation),
it applies at once and the condition clears."""

import time
from pathlib import Path

import pytest
import yaml

from kvpilot_operator.cluster import RETRY_SECONDS
from kvpilot_operator.rejection import ANNOTATION
from kvpilot_testing.kube.cluster import DEPLOYMENTS, EVENTS, MD, SERVICES, Cluster, wait_for

SAMPLE = Path(__file__).parents[2] / "crds" / "samples" / "builtin-cpu.yaml"
# The CRD takes any string map; a pod's nodeSelector keys must be label names.
BAD_KEY = "bad key!"


def _condition(cluster: Cluster, name: str, kind: str) -> dict:
    md = cluster.get(MD, name) or {}
    found = [c for c in md.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def _applies(kube, cluster: Cluster, name: str) -> list[dict]:
    """The operator's server-side applies of the Deployment `name`, from the audit log."""
    return [
        e
        for e in kube.plane.audit(kube.operator_user)
        if e["verb"] == "patch"
        and (e.get("objectRef") or {}).get("resource") == "deployments"
        and e["objectRef"].get("namespace") == cluster.ns
        and e["objectRef"].get("name") == name
    ]


@pytest.fixture
def body() -> dict:
    md = yaml.safe_load(SAMPLE.read_text())
    md["metadata"]["name"] = "refused"
    md["spec"]["scheduling"] = {"nodeSelector": {BAD_KEY: "x", "disk": "ssd"}}
    return md


def test_a_refused_spec_is_degraded_once_and_a_fixed_one_applies(
    own_operator, kube, body, tmp_path
):
    cluster = own_operator  # its own: the test reads its log
    cluster.create(MD, body)  # the CRD accepts it
    wait_for(
        "Degraded InvalidPodSpec",
        lambda: _condition(cluster, "refused", "Degraded").get("reason") == "InvalidPodSpec",
    )
    degraded = _condition(cluster, "refused", "Degraded")
    assert degraded["status"] == "True"
    # The API server's own words: which field, which value, and why.
    assert "spec.template.spec.nodeSelector" in degraded["message"]
    assert f'Invalid value: "{BAD_KEY}"' in degraded["message"]
    assert _condition(cluster, "refused", "Progressing")["status"] == "False"
    assert cluster.get(DEPLOYMENTS, "refused") is None
    assert cluster.get(SERVICES, "refused") is None  # applied after the Deployment: never reached

    def warnings() -> list[dict]:
        return [
            e
            for e in cluster.list(EVENTS)
            if e["type"] == "Warning"
            and e["reason"] == "InvalidPodSpec"
            and e["message"].startswith("Degraded=True")
        ]

    wait_for("a Warning Event", warnings)
    # Longer than kopf's retry interval: the old code applied again (with a traceback) by now.
    time.sleep(RETRY_SECONDS + 1.5)
    assert len(_applies(kube, cluster, "refused")) == 1
    assert len(warnings()) == 1
    log = (tmp_path / "operator.log").read_text()
    assert "Traceback" not in log and log.count("failed permanently") == 1
    print(degraded["message"])

    # Another refused spec: a new cause, one Event more (the reason stays InvalidPodSpec).
    typo = {"key": "nvidia.com/gpu", "operater": "Exists"}
    retry = {"nodeSelector": {BAD_KEY: None}, "tolerations": [typo]}
    cluster.patch(MD, "refused", {"spec": {"scheduling": retry}})
    wait_for("the second refusal", lambda: len(warnings()) == 2)
    message = _condition(cluster, "refused", "Degraded")["message"]
    assert "tolerations[0].operater: field not declared in schema" in message
    assert len(_applies(kube, cluster, "refused")) == 2  # once per spec

    # Fixed: a new generation, reconciled at once (kopf does not hold it back for a retry).
    fix = {"spec": {"scheduling": {"tolerations": None}}}
    fixed = time.monotonic()
    cluster.patch(MD, "refused", fix)
    deployment = wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, "refused"), 10)
    took = time.monotonic() - fixed
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd"}
    wait_for("the Service", lambda: cluster.get(SERVICES, "refused"))
    wait_for(
        "Degraded to clear",
        lambda: _condition(cluster, "refused", "Degraded").get("status") == "False",
    )
    assert _condition(cluster, "refused", "Degraded")["reason"] == "AsExpected"
    assert ANNOTATION not in cluster.get(MD, "refused")["metadata"].get("annotations", {})
    assert "Traceback" not in (tmp_path / "operator.log").read_text()
    print(f"the fixed spec's Deployment after {took:.2f} s")
