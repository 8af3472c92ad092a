"""The operator's status from what a real scheduler and kubelet say about its pods, not from
what the played node (kube/node.py) imitates: the scheduler's words for GPUs no node has, and
the kubelet's for an image that cannot be had. The chart is installed into the real node's
control plane and the operator runs under its ServiceAccount, as in tests/operator/."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvpilot_testing.kube.cluster import MD, Cluster, create_namespace, wait_for
from kvpilot_testing.kube.install import install
from kvpilot_testing.kube.realnode import NODE_NAME
from kvpilot_testing.paths import ROOT

SAMPLES = ROOT / "crds" / "samples"


@pytest.fixture(scope="module")
def cluster(real_node, tmp_path_factory) -> Iterator[Cluster]:
    installed = install(real_node.plane, "--set", "watch.scope=All")
    create_namespace(real_node.plane, "models")
    cluster = Cluster(real_node.plane, "models", installed.operator_kubeconfig)
    log: Path = tmp_path_factory.mktemp("operator") / "operator.log"
    cluster.start_operator(log)
    try:
        cluster.wait_for_operator()
        yield cluster
        cluster.delete_model_deployments()
    finally:
        cluster.stop_operator()
        cluster.close()
        print(log.read_text()[-3000:])  # shown when a test fails


def _sample(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name).read_text())


def _degraded(cluster: Cluster, name: str) -> dict:
    def found() -> dict | None:
        md = cluster.get(MD, name) or {}
        conditions = md.get("status", {}).get("conditions", [])
        return next(
            (c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None
        )

    return wait_for("Degraded", found, timeout=90)


def test_gpus_no_node_has_are_degraded_in_the_schedulers_words(cluster, real_node):
    with real_node.plane.client() as http:
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


def test_an_image_the_node_cannot_have_is_degraded_in_the_kubelets_words(cluster):
    """The operator's image (kvpilot:test) is on no registry the node can reach: the kubelet's
    pull fails, and status carries its message."""
    body = _sample("builtin-cpu.yaml")
    body["spec"]["resources"]["cpu"] = "500m"  # the node has 2 cores
    name = cluster.create(MD, body)["metadata"]["name"]
    condition = _degraded(cluster, name)
    assert condition["reason"] == "ImagePullBackOff"
    assert "kvpilot:test" in condition["message"]
