"""The chart with one operator replica and with several: one runs standalone under strategy
Recreate, with nothing of kopf's peering; several run with kopf's peering (the flag main.py
reads, the pod's name as kopf's identity), strategy RollingUpdate, and kopf's peering CRDs,
kept on uninstall like the ModelDeployment CRD. The RBAC of both is in test_chart_rbac.py; two
operators electing one for real, in test_chart_peering_live.py."""

import argparse
import json

import pytest
import yaml

from kvpilot_operator.main import add_operator_args
from kvpilot_testing.helm import NAMESPACE, component, objects, of_kind, one, render
from kvpilot_testing.paths import CHART

SCOPES = {
    "release": ({"watch": {"scope": "Release"}}, "kvpilot-operator"),
    "namespaces": (
        {"watch": {"scope": "Namespaces", "namespaces": ["team-a", "team-b"]}},
        "kvpilot-operator",
    ),
    # One ClusterKopfPeering for every release of the cluster: named like the ClusterRole.
    "all": ({"watch": {"scope": "All"}}, f"{NAMESPACE}-kvpilot-operator"),
}
PEERING_CRDS = {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def _operator(values: dict) -> tuple[dict, argparse.Namespace, dict]:
    """The operator's Deployment, its parsed command line and its container's env."""
    deployment = one(component(objects(render(values)), "operator"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    add_operator_args(parser)
    args = parser.parse_args(container["args"][1:])
    return deployment, args, {e["name"]: e for e in container["env"]}


def _crds(values: dict) -> dict[str, dict]:
    found = of_kind(objects(render(values)), "CustomResourceDefinition")
    return {c["metadata"]["name"]: c for c in found}


@pytest.mark.parametrize("scope", SCOPES)
def test_one_replica_runs_standalone_and_recreated(scope):
    values = {**SCOPES[scope][0], "operator": {"replicas": 1}}
    deployment, args, env = _operator(values)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert args.peering == "" and "POD_ID" not in env
    assert set(_crds(values)) == {"modeldeployments.kvpilot.dev"}


@pytest.mark.parametrize("scope", SCOPES)
def test_two_replicas_run_with_peering_and_roll(scope):
    values, name = SCOPES[scope]
    values = {**values, "operator": {"replicas": 2, "peeringLifetimeSeconds": 20}}
    deployment, args, env = _operator(values)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert args.peering == name and args.peering_lifetime == 20
    assert env["POD_ID"] == {
        "name": "POD_ID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }


def test_two_replicas_bring_kopfs_peering_crds_kept_on_uninstall_and_optional():
    two = {"operator": {"replicas": 2}}
    crds = _crds(two)
    assert set(crds) == {"modeldeployments.kvpilot.dev", *PEERING_CRDS}
    source = {
        c["metadata"]["name"]: c
        for c in yaml.safe_load_all((CHART / "crd" / "kopf-peering.yaml").read_text())
    }
    for name in PEERING_CRDS:
        rendered = crds[name]
        meta = rendered["metadata"]
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert meta.pop("labels")["app.kubernetes.io/managed-by"] == "Helm"
        assert json.dumps(rendered, sort_keys=True) == json.dumps(source[name], sort_keys=True)
    # kopf's own layout: the namespaced kind in each watched namespace, the other cluster-wide.
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    # Already in the cluster (another kopf operator), or CRDs managed elsewhere.
    assert set(_crds({**two, "crds": {"peering": False}})) == {"modeldeployments.kvpilot.dev"}
    assert _crds({**two, "crds": {"enabled": False}}) == {}
