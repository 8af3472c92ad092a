"""The test kubelet (kvpilot_testing.kube.node): a pod's server is reported ready only once it
answers, and stop() stops every server it started by its process, one still loading too, so a
test that ends (or fails) while a pod starts leaves no `kvpilot serve` behind."""

import subprocess

from kvpilot_testing.kube.cluster import PODS, wait_for
from kvpilot_testing.kube.node import Node, serve_tiny


def _pod(name: str) -> dict:
    container = {"name": "server", "image": "kvpilot:test", "args": ["--served-model-name=tiny"]}
    return {"metadata": {"name": name}, "spec": {"containers": [container]}}


def _ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_server_still_loading_is_stopped_with_the_node(kube_namespace, tiny_dir):
    cluster = kube_namespace
    node = Node(cluster, *serve_tiny(tiny_dir("llama")))
    node.start(interval=0.1)
    try:
        cluster.create(PODS, _pod("loading"))
        started = wait_for("its server started", lambda: node.servers.get("loading"))
        process: subprocess.Popen = started[0]
        # Bound, not yet ready: the server has not answered (it loads for seconds; the pass
        # that bound it probes it at once, and it cannot answer within that pass).
        assert not _ready(cluster.get(PODS, "loading"))
    finally:
        node.stop()
    assert process.poll() is not None  # stop() returned with it gone
    assert node.servers == {}


def test_a_pod_is_ready_with_its_address_once_its_server_answers(kube_namespace, tiny_dir):
    cluster = kube_namespace
    node = Node(cluster, *serve_tiny(tiny_dir("llama")))
    node.start(interval=0.1)
    try:
        cluster.create(PODS, _pod("serving"))
        # A server's start (torch imported, the model loaded) takes tens of seconds under load.
        pod = wait_for(
            "the pod ready", lambda: _ready(p := cluster.get(PODS, "serving")) and p, timeout=120
        )
        process, address = node.servers["serving"]
        assert pod["status"]["podIP"] == address and process.poll() is None
    finally:
        node.stop()
    assert process.poll() is not None and not node.errors
