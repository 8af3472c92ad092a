"""The operator as platform teams run it: `helm install` of the chart with the operator image
built from the Dockerfile (conftest.py's chart, which the model tests share), the operator a pod
the kubelet starts from it (uid 1000, read-only root, the chart's probes), reaching the API
server through the `kubernetes` Service under the chart's ServiceAccount, and the gateway's two
pods from the same image behind their Service. Its status comes from what the real scheduler
and kubelet say about the model pods: the scheduler's words for GPUs no node has, the
kubelet's for an image it cannot pull (applied with kubectl). `helm uninstall` last of the
session's chart tests (conftest.py orders it), which leaves the users' objects and the CRD."""

import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from kvpilot_common.naming import INSTANCE_LABEL
from kvpilot_testing.kube.cluster import MD, PODS, Cluster, wait_for
from kvpilot_testing.kube.install import CRD_NAME, NAMESPACE, RELEASE, helm
from kvpilot_testing.kube.realnode import NAMESPACE as NETNS
from kvpilot_testing.kube.realnode import NODE_NAME
from kvpilot_testing.paths import ROOT

SAMPLES = ROOT / "crds" / "samples"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-operator"
UNPULLABLE = "unpullable"


@pytest.fixture(scope="module")
def cluster(chart: Cluster) -> Iterator[Cluster]:
    """The session's chart (conftest.py); the operator's log shown when a test fails."""
    try:
        yield chart
    finally:
        print(_operator_log(chart)[-4000:])


def _operator_log(cluster: Cluster) -> str:
    """The operator pod's log, through the API server from the kubelet."""
    pod = _operator_pod(cluster)
    if pod is None:
        return "no operator pod"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log"
    with cluster.plane.client() as http:
        return http.get(path).text


def _pods(cluster: Cluster, component: str) -> list[dict]:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    selector = f"app.kubernetes.io/component={component}"
    with cluster.plane.client() as http:
        return http.get(path, params={"labelSelector": selector}).json().get("items", [])


def _operator_pod(cluster: Cluster) -> dict | None:
    pods = _pods(cluster, "operator")
    return pods[0] if pods else None


def _is_ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _sample(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name).read_text())


def _degraded(cluster: Cluster, name: str) -> dict:
    def found() -> dict | None:
        conditions = (cluster.get(MD, name) or {}).get("status", {}).get("conditions", [])
        true = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        return true[0] if true else None

    return wait_for("Degraded", found, timeout=60)


def test_the_operator_runs_as_a_pod_from_its_image(cluster):
    def ready() -> dict | None:
        pod = _operator_pod(cluster) or {}
        conditions = pod.get("status", {}).get("conditions", [])
        return (
            pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None
        )

    pod = wait_for("the operator's pod to be Ready", ready, timeout=120)
    container = pod["spec"]["containers"][0]
    assert container["image"].startswith("localhost/kvpilot:")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["serviceAccountName"] == f"{RELEASE}-operator"


def test_gpus_no_node_has_are_degraded_in_the_schedulers_words(cluster):
    with cluster.plane.client() as http:
        http.patch(
            f"/api/v1/nodes/{NODE_NAME}/status",
            json={"status": {"capacity": {"nvidia.com/gpu": "2"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
    body = _sample("hf-gpu-int8-autoscaled.yaml")
    del body["spec"]["model"]["tokenSecretRef"], body["spec"]["auth"]
    body["spec"]["autoscaling"]["enabled"] = False
    body["spec"]["resources"] |= {"gpus": 4, "cpu": "100m", "memory": "256Mi"}
    name = cluster.create(MD, body)["metadata"]["name"]
    condition = _degraded(cluster, name)
    assert condition["reason"] == "Unschedulable"
    assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu" in condition["message"]
    # Written by the operator's pod, under the chart's ServiceAccount.
    writers = {
        e["user"]["username"]
        for e in cluster.plane.audit()
        if e.get("objectRef", {}).get("subresource") == "status"
        and e["objectRef"].get("name") == name
        and e["verb"] in ("patch", "update")
    }
    assert writers == {OPERATOR}


def test_the_gateway_runs_as_pods_and_answers_through_its_service(cluster):
    """Both replicas on the one node (their anti-affinity is a preference), Ready by their
    probe; from the node's namespace, as a client pod would, the Service answers."""
    wait_for(
        "two Ready gateway pods",
        lambda: [p for p in _pods(cluster, "gateway") if _is_ready(p)][1:],
        timeout=120,
    )
    service = cluster.plane.get(f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-gateway")
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/ready"
    script = f"import httpx; print(httpx.get({url!r}).status_code)"
    argv = ["nsenter", f"--net=/run/netns/{NETNS}", "--", sys.executable, "-c", script]
    tries: list[subprocess.CompletedProcess] = []

    def answered() -> bool:
        tries.append(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False))
        return tries[-1].stdout.strip() == "200"

    # Ready pods reach the Service's endpoints first and kube-proxy's rules a moment later;
    # until then the cluster IP refuses, as it would for any client pod.
    try:
        wait_for("an answer through the gateway Service", answered, timeout=30, interval=1)
    except TimeoutError as timed_out:
        raise AssertionError(tries[-1].stderr[-2000:]) from timed_out


def test_kubectl_apply_of_the_cpu_sample_meets_an_image_the_node_cannot_pull(cluster, tmp_path):
    """The published server image (the chart's default registry and repository, which the
    session's chart replaces with the image built here) is on no registry the node can reach:
    the kubelet's pull fails, and status carries its words."""
    body = _sample("builtin-cpu.yaml")
    body["metadata"]["name"] = UNPULLABLE  # the model tests' smollm2 may still be going
    body["spec"]["image"] = "ghcr.io/kvpilot/kvpilot:0.1.0-cpu"
    body["spec"]["resources"]["cpu"] = "500m"  # the node has 2 cores
    (tmp_path / "md.yaml").write_text(yaml.safe_dump(body))
    kubectl = [cluster.plane.bin / "kubectl", "--kubeconfig", cluster.plane.kubeconfig]
    applied = subprocess.run(
        [*kubectl, "-n", "models", "apply", "-f", tmp_path / "md.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    name = body["metadata"]["name"]
    condition = _degraded(cluster, name)
    assert condition["reason"] == "ImagePullBackOff"
    assert "ghcr.io/kvpilot/kvpilot" in condition["message"]
    # Its pod holds half a core of the node's two, which the model tests after these need.
    cluster.delete(MD, name)
    wait_for("its pod to go", lambda: not _model_pods(cluster, name), timeout=60, interval=0.5)


def _model_pods(cluster: Cluster, name: str) -> list[dict]:
    with cluster.plane.client() as http:
        params = {"labelSelector": f"{INSTANCE_LABEL}={name}"}
        return http.get(cluster.path(PODS), params=params).json().get("items", [])


def test_helm_uninstall_leaves_the_model_deployments_and_the_crd(cluster):
    """Last of the chart's tests (conftest.py orders it): the chart goes (its operator and
    gateway pods with it), the users' objects stay (these tests' and any the model tests left)."""
    users = {m["metadata"]["name"] for m in cluster.list(MD)}
    assert "qwen25-7b" in users
    helm(cluster.plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "90s")
    assert cluster.plane.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    assert {m["metadata"]["name"] for m in cluster.list(MD)} == users
    wait_for(
        "the chart's pods to go",
        lambda: not _pods(cluster, "operator") + _pods(cluster, "gateway"),
        timeout=60,
    )
