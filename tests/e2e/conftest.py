"""The real node's fixtures, one of each for the whole session: a control plane whose API server
the node can reach, containerd, the kubelet and the scheduler, with the sandbox and workload
images imported (real_node); kvpilot's chart installed on it (chart), which the operator and
the model tests share; the server-cpu image imported in the background from the chart's
install on (server_cpu). The order of the tests (pytest_collection_modifyitems) lets that
import run while the operator's and the node's own tests do, and ends the session with the
chart's uninstall, then the host compared with what it was before the node began."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvpilot_testing.kube.background import BackgroundImport
from kvpilot_testing.kube.cluster import Cluster, create_namespace, wait_for
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.hoststate import host_state
from kvpilot_testing.kube.images import chart_values, node_images, project_archive, project_image
from kvpilot_testing.kube.install import NAMESPACE, install
from kvpilot_testing.kube.realnode import HOST_IP, RealNode, delete_network

GATEWAY_SECRET = "kvpilot-gateway"  # the Secret's name in the release and model namespaces
MODELS = "models"  # the model namespace


@dataclass
class Node:
    plane: ControlPlane
    node: RealNode
    host_before: dict[str, str]  # host_state() before anything started
    imports: list[BackgroundImport] = field(default_factory=list)

    def stop(self) -> None:
        """The node, the control plane, then the network they share (idempotent)."""
        try:
            for started in self.imports:
                started.stop()
            self.node.stop()
            self.plane.stop()
        finally:
            delete_network()


@pytest.fixture(scope="session")
def real_node(tmp_path_factory) -> Iterator[Node]:
    images = node_images()  # built (or found cached) before anything starts
    before = host_state()
    RealNode.create_network()
    plane = ControlPlane(tmp_path_factory.mktemp("realnode-plane"), address=HOST_IP)
    node = RealNode(tmp_path_factory.mktemp("realnode"), plane)
    started = Node(plane, node, before)
    try:
        plane.start()
        node.start(images)
        yield started
    finally:
        started.stop()  # the session's last test may have stopped it to compare the host


@pytest.fixture(scope="session")
def server_cpu(real_node) -> BackgroundImport:
    """The server-cpu image (gigabytes) on its way into the node: wait() before a model pod."""
    started = BackgroundImport(real_node.node, project_image("server-cpu")[1])
    real_node.imports.append(started)
    return started


@pytest.fixture(scope="session")
def chart(real_node, server_cpu) -> Iterator[Cluster]:
    """`helm install` of the chart with the operator image built from the Dockerfile (imported
    here) and server-cpu as the models' image (on its way in: server_cpu), the gateway's
    secret created first as a platform team does: returns once the operator's and the
    gateway's pods are all Ready. The session's last chart test uninstalls it."""
    name, archive = project_image("operator")
    real_node.node.import_image(archive)
    values = ["--set", "watch.scope=All", "--set", "image.pullPolicy=Never"]
    values += ["--set", f"gateway.secretRef.name={GATEWAY_SECRET}"]
    values += chart_values("image", name)
    values += chart_values("modelImage", project_archive("server-cpu")[0])
    for namespace in (NAMESPACE, MODELS):
        create_namespace(real_node.plane, namespace)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": GATEWAY_SECRET}}
        secret["stringData"] = {"secret": "e2e-gateway-secret"}
        with real_node.plane.client() as http:
            http.post(f"/api/v1/namespaces/{namespace}/secrets", json=secret).raise_for_status()
    installed = install(real_node.plane, *values)
    cluster = Cluster(real_node.plane, MODELS, installed.operator_kubeconfig)

    def chart_ready() -> bool:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        items = (real_node.plane.get(path) or {}).get("items", [])
        return bool(items) and all(
            d["status"].get("readyReplicas") == d["spec"]["replicas"] for d in items
        )

    # A pod's Ready is the kubelet's probe result, which the Deployment's status carries: a
    # poll of a second is well under the probes' own period.
    wait_for("the chart's pods to be Ready", chart_ready, timeout=180, interval=1)
    try:
        yield cluster
    finally:
        cluster.close()


# The order of the session: the operator's tests first (their chart fixture starts the
# server-cpu import), the node's own while it goes on, the models' (which wait for it), then,
# whatever order the files were named in, the chart's uninstall once no test needs the chart,
# and last the host's comparison, which stops the node.
ORDER = (
    "test_operator_on_a_real_node.py",
    "test_real_node.py",
    "test_model_on_a_real_node.py",
    "test_helm_uninstall_leaves_the_model_deployments_and_the_crd",
    "test_the_host_is_as_it_was",
)


def _place(item: pytest.Item) -> int:
    if Path(__file__).parent not in Path(item.path).parents:
        return -1  # any other test: before these, as collected
    if item.name in ORDER:
        return ORDER.index(item.name)
    return ORDER.index(Path(item.path).name) if Path(item.path).name in ORDER else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The session's first test also sets up its node and may build the images (about 10
    minutes on two cores the first time; scripts/test.sh builds them in a step before): more
    than the suite's per-test timeout."""
    items.sort(key=_place)  # stable: each file's tests keep their order
    for item in items:
        if _place(item) >= 0:
            item.add_marker(pytest.mark.timeout(1800))
