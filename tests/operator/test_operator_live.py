"""The real operator (`kvpilot operator`, kopf) against the Kubernetes API stand-in over HTTP on
127.0.0.1, with the test playing the Deployment controller, the kubelet and the garbage
collector."""

import socket
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.operator.kube_cluster import DEPLOYMENTS, MD, StandInCluster, wait_for

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
SERVICES = "/api/v1/namespaces/{ns}/services"
EVENTS = "/api/v1/namespaces/{ns}/events"
UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        }
    ],
}


@pytest.fixture
def cluster(tmp_path):
    stand_in = StandInCluster(tmp_path)
    log = tmp_path / "operator.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stand_in.liveness = f"http://127.0.0.1:{port}/healthz"
    stand_in.start_operator(log, liveness=stand_in.liveness)
    try:
        stand_in.wait_for_operator()
        yield stand_in
    finally:
        stand_in.close()
        print(log.read_text()[-3000:])  # shown by pytest when the test fails


def _sample(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name).read_text())


def _condition(cluster: StandInCluster, name: str, kind: str) -> dict:
    md = cluster.get(MD, name) or {}
    found = [c for c in md.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def _owned_by(obj: dict | None, owner: dict) -> bool:
    refs = (obj or {}).get("metadata", {}).get("ownerReferences", [])
    return any(r["uid"] == owner["metadata"]["uid"] and r.get("controller") for r in refs)


def test_lifecycle_apply_ready_change_scale_unschedulable_delete(cluster):
    md = cluster.create(MD, _sample("builtin-cpu.yaml"))
    name = md["metadata"]["name"]
    deployment = wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, name))
    # The Service is applied right after the Deployment: wait for it too, not only the first.
    service = wait_for("the Service", lambda: cluster.get(SERVICES, name))
    assert _owned_by(deployment, md) and _owned_by(service, md)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--model=builtin://smollm2-135m-instruct" in args

    cluster.run_deployment_controller()
    ready = wait_for("Ready", lambda: _condition(cluster, name, "Ready").get("status") == "True")
    assert ready
    status = cluster.get(MD, name)["status"]
    assert (
        status["readyReplicas"] == 1 and status["endpoint"] == f"http://{name}.default.svc:8000/v1"
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

    # kubectl scale goes through the scale subresource.
    cluster.patch(MD, name, {"spec": {"replicas": 3}}, subresource="scale")
    wait_for("3 replicas", lambda: cluster.get(DEPLOYMENTS, name)["spec"]["replicas"] == 3)
    assert _owned_by(wait_for("a PDB", lambda: cluster.get(PDBS, name)), md)

    # Pods that cannot be scheduled: Degraded, with the scheduler's own words.
    cluster.run_deployment_controller(pod_status=UNSCHEDULABLE)
    degraded = wait_for(
        "Degraded", lambda: _condition(cluster, name, "Degraded").get("status") == "True"
    )
    assert degraded
    condition = _condition(cluster, name, "Degraded")
    assert condition["reason"] == "Unschedulable"
    assert "4 Insufficient nvidia.com/gpu" in condition["message"]
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
    assert cluster.collect_garbage() >= 3  # no finalizer held the deletion up
    assert cluster.get(DEPLOYMENTS, name) is None and cluster.get(SERVICES, name) is None


def test_liveness_endpoint_answers(cluster):
    assert httpx.get(cluster.liveness, timeout=5).status_code == 200


def test_a_model_that_cannot_fit_creates_no_pods_and_says_why(cluster):
    body = _sample("hf-gpu-int8-autoscaled.yaml")
    body["spec"]["model"]["source"] = "hf://meta-llama/Llama-3.1-70B-Instruct"
    body["spec"]["engine"] = {"maxModelLen": 8192}
    md = cluster.create(MD, body)
    name = md["metadata"]["name"]
    wait_for("Degraded", lambda: _condition(cluster, name, "Degraded").get("status") == "True")
    condition = _condition(cluster, name, "Degraded")
    assert condition["reason"] == "InsufficientGPUMemory"
    assert "MiB of weights" in condition["message"] and "23034 MiB" in condition["message"]
    assert cluster.get(DEPLOYMENTS, name) is None


def test_a_path_outside_the_claim_creates_no_pods_and_says_why(cluster):
    # The stand-in, like an API server without CEL, lets the source through.
    body = _sample("pvc-tolerations.yaml")
    body["spec"]["model"]["source"] = "pvc://model-store/../.."
    name = cluster.create(MD, body)["metadata"]["name"]
    wait_for("Degraded", lambda: _condition(cluster, name, "Degraded").get("status") == "True")
    condition = _condition(cluster, name, "Degraded")
    assert condition["reason"] == "InvalidModelSource" and "'..'" in condition["message"]
    assert cluster.get(DEPLOYMENTS, name) is None


def test_operator_restarted_mid_way_converges_without_duplicates(cluster, tmp_path):
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
