"""The real operator (`kvpilot operator`, kopf, under the chart's ServiceAccount and RBAC)
against the real control plane (kube-apiserver, etcd, kube-controller-manager: the real
Deployment, ReplicaSet and garbage-collector controllers), with the test playing the node."""

import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import yaml

from kvpilot_testing.kube.cluster import (
    DEPLOYMENTS,
    EVENTS,
    MD,
    PDBS,
    PODS,
    SERVICES,
    Cluster,
    wait_for,
)
from kvpilot_testing.kube.node import Node

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"


@pytest.fixture
def node(cluster):
    node = Node(cluster)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        print("node errors:", node.errors[-5:])


def _sample(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name).read_text())


def _condition(cluster: Cluster, name: str, kind: str) -> dict:
    md = cluster.get(MD, name) or {}
    found = [c for c in md.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def _owned_by(obj: dict | None, owner: dict) -> bool:
    refs = (obj or {}).get("metadata", {}).get("ownerReferences", [])
    return any(r["uid"] == owner["metadata"]["uid"] and r.get("controller") for r in refs)


def test_lifecycle_apply_ready_change_scale_unschedulable_delete(cluster, node):
    md = cluster.create(MD, _sample("builtin-cpu.yaml"))
    name = md["metadata"]["name"]
    deployment = wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, name))
    # The Service is applied right after the Deployment: wait for it too, not only the first.
    service = wait_for("the Service", lambda: cluster.get(SERVICES, name))
    assert _owned_by(deployment, md) and _owned_by(service, md)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--model=builtin://smollm2-135m-instruct" in args

    ready = wait_for("Ready", lambda: _condition(cluster, name, "Ready").get("status") == "True")
    assert ready
    status = cluster.get(MD, name)["status"]
    assert (
        status["readyReplicas"] == 1
        and status["endpoint"] == f"http://{name}.{cluster.ns}.svc:8000/v1"
    )
    assert status["observedGeneration"] == 1 and status["capacity"]["sequencesAtMaxModelLen"] >= 1
    # kopf posts Events from a queue, a moment after the status patch.
    wait_for(
        "a Normal Event",
        lambda: any(
            e["reason"] == "AllReplicasReady" and e["type"] == "Normal"
            for e in cluster.list(EVENTS)
        ),
    )
    time.sleep(1.5)  # three more status refreshes: the transition must not be announced again
    assert sum(e["reason"] == "AllReplicasReady" for e in cluster.list(EVENTS)) == 1

    # A spec change rolls out: the Deployment's pod template follows.
    cluster.patch(MD, name, {"spec": {"engine": {"maxNumSeqs": 8}}})

    def rolled() -> bool:
        container = cluster.get(DEPLOYMENTS, name)["spec"]["template"]["spec"]["containers"][0]
        return "--max-num-seqs=8" in container["args"]

    wait_for("the Deployment to take the new spec", rolled)
    wait_for(
        "observedGeneration 2", lambda: cluster.get(MD, name)["status"]["observedGeneration"] == 2
    )

    # kubectl scale goes through the scale subresource; the node is full from now on.
    node.schedulable = False
    cluster.patch(MD, name, {"spec": {"replicas": 3}}, subresource="scale")
    wait_for("3 replicas", lambda: cluster.get(DEPLOYMENTS, name)["spec"]["replicas"] == 3)
    assert _owned_by(wait_for("a PDB", lambda: cluster.get(PDBS, name)), md)

    # Pods that cannot be scheduled: Degraded, with the scheduler's own words.
    degraded = wait_for(
        "Degraded", lambda: _condition(cluster, name, "Degraded").get("status") == "True"
    )
    assert degraded
    condition = _condition(cluster, name, "Degraded")
    assert condition["reason"] == "Unschedulable"
    assert "1 Insufficient nvidia.com/gpu" in condition["message"]
    assert _condition(cluster, name, "Ready")["status"] == "False"
    wait_for(
        "a Warning Event",
        lambda: any(
            e["type"] == "Warning" and "Insufficient nvidia.com/gpu" in e["message"]
            for e in cluster.list(EVENTS)
        ),
    )

    cluster.delete(MD, name)
    wait_for("the ModelDeployment to go", lambda: cluster.get(MD, name) is None)
    # The garbage collector follows the owner references the operator set: every child goes,
    # and the pods with them.
    for kind in (DEPLOYMENTS, SERVICES, PDBS):
        wait_for(f"{kind} to be collected", lambda kind=kind: cluster.get(kind, name) is None)
    wait_for("the pods to be collected", lambda: not cluster.list(PODS))


def test_liveness_endpoint_answers(kube, cluster):
    assert kube.operator is not None
    assert httpx.get(kube.operator.liveness, timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("source", "reason", "said"),
    [
        ("hf://meta-llama/Llama-3.1-70B-Instruct", "InsufficientGPUMemory", "23034 MiB"),
        # Catalogued, and an architecture the engine would refuse at load: no crash-looping pod.
        (
            "hf://google/gemma-3-27b-it",
            "UnsupportedArchitecture",
            "Unsupported model architecture 'Gemma3ForConditionalGeneration'. kvpilot supports: ",
        ),
    ],
)
def test_a_model_that_cannot_run_creates_no_pods_and_says_why(cluster, source, reason, said):
    body = _sample("hf-gpu-int8-autoscaled.yaml")
    body["spec"]["model"]["source"] = source
    body["spec"]["engine"] = {"maxModelLen": 8192}
    md = cluster.create(MD, body)
    name = md["metadata"]["name"]
    wait_for("Degraded", lambda: _condition(cluster, name, "Degraded").get("status") == "True")
    condition = _condition(cluster, name, "Degraded")
    assert condition["reason"] == reason
    assert said in condition["message"]
    assert cluster.get(DEPLOYMENTS, name) is None


def test_a_path_outside_the_claim_is_refused_by_the_api_server(cluster):
    # The CRD's CEL rule refuses it before the operator sees it; the operator's own check of
    # the same rule (for a CRD applied without CEL) is tested against the CRD's in test_crd.
    body = _sample("pvc-tolerations.yaml")
    body["spec"]["model"]["source"] = "pvc://model-store/../.."
    response = cluster.http.post(cluster.path(MD), json=body)
    assert response.status_code == 422, response.text
    assert "spec.model.source" in response.json()["message"]
    assert cluster.list(MD) == [] and cluster.list(DEPLOYMENTS) == []


def test_operator_restarted_mid_way_converges_without_duplicates(own_operator, tmp_path):
    cluster = own_operator
    first = cluster.create(MD, _sample("builtin-cpu.yaml"))
    wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, "smollm2"))
    cluster.stop_operator()
    # While the operator is down: a spec change and a second ModelDeployment.
    cluster.patch(MD, "smollm2", {"spec": {"engine": {"maxNumSeqs": 4}}})
    second = _sample("builtin-cpu.yaml")
    second["metadata"]["name"] = "second"
    cluster.create(MD, second)
    cluster.start_operator(tmp_path / "operator-2.log")
    wait_for("the second Deployment", lambda: cluster.get(DEPLOYMENTS, "second"))

    def caught_up() -> bool:
        container = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"][0]
        return "--max-num-seqs=4" in container["args"]

    wait_for("the first Deployment to catch up", caught_up)
    names = sorted(d["metadata"]["name"] for d in cluster.list(DEPLOYMENTS))
    assert names == ["second", "smollm2"]
    assert _owned_by(cluster.get(DEPLOYMENTS, "smollm2"), first)
    assert cluster.operator is not None and cluster.operator.poll() is None


def test_status_follows_the_pods_from_watches_and_costs_nothing_when_idle(cluster, kube):
    """A pod turning ready reaches status through the operator's watch (the safety resync is
    minutes away); then, with nothing changing, the operator sends the API server nothing: no
    GET of the Deployment, no LIST of pods, no status patch."""
    node = Node(cluster)  # by hand: one pass at a time
    name = cluster.create(MD, _sample("builtin-cpu.yaml"))["metadata"]["name"]
    wait_for("the pod", lambda: cluster.list(PODS), timeout=60)
    node.sync()  # bound, running, ready
    wait_for("Ready", lambda: _condition(cluster, name, "Ready").get("status") == "True")

    time.sleep(1)  # the Events and the last writes of the transition land
    start = time.time()
    time.sleep(3)
    # The session's operator serves other tests' namespaces too: its calls here, or cluster-wide.
    calls = [
        f"{e['verb']} {e['requestURI']}"
        for e in kube.plane.audit(kube.operator_user)
        if e["stage"] == "ResponseComplete"
        and e["verb"] != "watch"
        and (e.get("objectRef") or {}).get("namespace") in (cluster.ns, None)
        and start <= datetime.fromisoformat(e["requestReceivedTimestamp"]).timestamp()
    ]
    assert calls == []
    # What it watches, it watches with the label selector of its children: the API server
    # sends it no other workload's pods.
    watches = [
        e["requestURI"]
        for e in kube.plane.audit(kube.operator_user)
        if e["verb"] == "watch" and e["objectRef"]["resource"] in ("pods", "deployments")
    ]
    assert watches and all("managed-by%3Dkvpilot-operator" in uri for uri in watches), watches
