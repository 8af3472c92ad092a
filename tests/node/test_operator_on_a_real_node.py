"""The operator as platform teams run it: `helm install` of the chart with the operator image
built from the Dockerfile, the operator a pod the kubelet starts from it (uid 1000, read-only
root, the chart's probes), reaching the API server through the `kubernetes` Service under the
chart's ServiceAccount. Its status comes from what the real scheduler and kubelet say about
the model pods: the scheduler's words for GPUs no node has, the kubelet's for an image it
cannot pull."""

from collections.abc import Iterator

import pytest
import yaml

from kvpilot_testing.kube.cluster import MD, Cluster, create_namespace, wait_for
from kvpilot_testing.kube.images import project_image
from kvpilot_testing.kube.install import NAMESPACE, RELEASE, install
from kvpilot_testing.kube.realnode import NODE_NAME
from kvpilot_testing.paths import ROOT

SAMPLES = ROOT / "crds" / "samples"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-operator"


@pytest.fixture(scope="module")
def cluster(real_node) -> Iterator[Cluster]:
    name, archive = project_image("operator")
    real_node.node.import_image(archive)
    registry, _, rest = name.partition("/")
    repository, _, tag = rest.partition(":")
    image = [f"image.registry={registry}", f"image.repository={repository}", f"image.tag={tag}"]
    # The model pods' image is on no registry the node can reach (one test is about that).
    values = ["watch.scope=All", "image.pullPolicy=Never", "gateway.enabled=false", *image]
    installed = install(real_node.plane, *(a for v in values for a in ("--set", v)))
    create_namespace(real_node.plane, "models")
    cluster = Cluster(real_node.plane, "models", installed.operator_kubeconfig)
    try:
        yield cluster
        cluster.delete_model_deployments()
    finally:
        print(_operator_log(cluster)[-4000:])  # shown when a test fails
        cluster.close()


def _operator_log(cluster: Cluster) -> str:
    """The operator pod's log, through the API server from the kubelet."""
    pod = _operator_pod(cluster)
    if pod is None:
        return "no operator pod"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log"
    with cluster.plane.client() as http:
        return http.get(path).text


def _operator_pod(cluster: Cluster) -> dict | None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    with cluster.plane.client() as http:
        pods = http.get(path, params={"labelSelector": "app.kubernetes.io/component=operator"})
    items = pods.json().get("items", [])
    return items[0] if items else None


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


def test_an_image_the_node_cannot_pull_is_degraded_in_the_kubelets_words(cluster):
    body = _sample("builtin-cpu.yaml")
    body["spec"]["resources"]["cpu"] = "500m"  # the node has 2 cores
    name = cluster.create(MD, body)["metadata"]["name"]
    condition = _degraded(cluster, name)
    assert condition["reason"] == "ImagePullBackOff"
    assert "ghcr.io/kvpilot/kvpilot" in condition["message"]
