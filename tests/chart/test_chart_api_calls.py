"""permissions.py against what the operator really does: the real `kvpilot operator -n default`
against the Kubernetes API stand-in of tests/operator (serving CRDs too, as a real cluster
does), every request recorded, through a life that makes each kind of call (children created
and patched, a PodDisruptionBudget created and deleted, a scale through the subresource,
status, Events). Every call must be declared, at its scope, and every declaration used."""

import os
import subprocess
import sys

import pytest

from kvpilot_operator import permissions
from tests.operator import kube_emulator
from tests.operator.kube_cluster import DEPLOYMENTS, MD, StandInCluster, wait_for

PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
EVENTS = "/api/v1/namespaces/{ns}/events"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
TEST_CLIENT = "kvpilot-chart-test"
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 1,
    # No pod ever gets ready: the autoscaler holds at minReplicas, so it scales 1 -> 2 at once.
    "autoscaling": {
        "enabled": True,
        "minReplicas": 2,
        "maxReplicas": 3,
        "targetQueueDepth": 2,
        "intervalSeconds": 1,
        "windowSeconds": 10,
    },
}


def _is_public(path: str) -> bool:
    """Discovery (/api, /api/v1, /apis, /apis/GROUP[/VERSION]) and /version: every
    authenticated client may read them (system:discovery), no rule is needed."""
    parts = path.strip("/").split("/")
    return (
        parts == ["version"]
        or (parts[0] == "api" and len(parts) <= 2)
        or (parts[0] == "apis" and len(parts) <= 3)
    )


def _verb(method: str, name: str | None, query: dict) -> str:
    if method == "GET":
        if name:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}[method]


def _authorization(method: str, path: str, query: dict) -> tuple[str, str, str, str | None]:
    """(api group, resource[/subresource], verb, namespace) as the API server's authorizer
    sees a request; namespace None for a cluster-scoped request."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:  # not /namespaces nor /namespaces/NAME
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    return group, resource, _verb(method, name, query), namespace


def _reasons(events: list[dict]) -> set[str]:
    return {e["reason"] for e in events}


def _declared(namespace: str) -> set[tuple[str, str, str, str | None]]:
    found = {
        (p.api_group, p.resource, verb, namespace)
        for p in permissions.NAMESPACED
        for verb in p.verbs
    }
    for p in permissions.CLUSTER + permissions.CLUSTER_WHEN_NAMESPACED:
        found |= {(p.api_group, p.resource, verb, None) for verb in p.verbs}
    return found


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A stand-in cluster that also serves CRDs (so kopf observes them, as in a real one),
    and the list of (method, path, query) it received."""
    calls: list[tuple[str, str, dict]] = []
    serve = kube_emulator.Emulator.__call__

    async def record(self, raw_request):
        if raw_request.headers.get("User-Agent") != TEST_CLIENT:
            calls.append((raw_request.method, raw_request.path, dict(raw_request.query)))
        return await serve(self, raw_request)

    monkeypatch.setattr(kube_emulator.Emulator, "__call__", record)
    resources = {**kube_emulator.RESOURCES, CRDS: ("CustomResourceDefinition", False, set())}
    monkeypatch.setattr(kube_emulator, "RESOURCES", resources)
    cluster = StandInCluster(tmp_path)
    cluster.http.headers["User-Agent"] = TEST_CLIENT  # the test's own requests go unrecorded
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "KVPILOT_IMAGE": "kvpilot:test"}
    env["KVPILOT_STATUS_INTERVAL_SECONDS"] = "0.5"
    cmd = [sys.executable, "-m", "kvpilot_server.cli", "operator", "-n", cluster.ns]
    cmd += ["--liveness", "", "--metrics-port", "0"]
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        operator = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        cluster.wait_for_operator()
        yield cluster, calls
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=20)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()
        cluster.close()
        print(log.read_text()[-3000:])  # shown when the test fails


def test_every_api_call_the_operator_makes_is_declared(recorded):
    cluster, calls = recorded
    cluster.create(MD, {"metadata": {"name": "calls"}, "spec": SPEC})
    wait_for("the scale to 2", lambda: cluster.get(MD, "calls")["spec"]["replicas"] == 2)
    wait_for("a PDB", lambda: cluster.get(PDBS, "calls"))
    wait_for("a ScaledUp Event", lambda: "ScaledUp" in _reasons(cluster.list(EVENTS)))
    cluster.patch(MD, "calls", {"spec": {"autoscaling": {"enabled": False}, "replicas": 1}})
    wait_for("the PDB to go", lambda: cluster.get(PDBS, "calls") is None)
    wait_for("1 replica", lambda: cluster.get(DEPLOYMENTS, "calls")["spec"]["replicas"] == 1)

    made = set()
    for method, path, query in list(calls):
        if not _is_public(path):
            made.add(_authorization(method, path, query))
    undeclared = made - _declared(cluster.ns)
    assert undeclared == set()
    # And nothing is declared that the operator does not need: the life above made every call
    # but one, a permission the OwnerReferencesPermissionEnforcement admission plugin checks.
    admission_only = {("kvpilot.dev", "modeldeployments/finalizers", "update", cluster.ns)}
    assert _declared(cluster.ns) - made == admission_only
