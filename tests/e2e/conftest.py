"""The real node's fixture: a control plane whose API server the node can reach, containerd,
the kubelet and the scheduler, with the sandbox and workload images imported."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.hoststate import host_state
from kvpilot_testing.kube.images import node_images
from kvpilot_testing.kube.realnode import HOST_IP, RealNode, delete_network


@dataclass
class Node:
    plane: ControlPlane
    node: RealNode
    host_before: dict[str, str]  # host_state() before anything started


@pytest.fixture(scope="module")
def real_node(tmp_path_factory) -> Iterator[Node]:
    images = node_images()  # built (or found cached) before anything starts
    before = host_state()
    RealNode.create_network()
    plane = ControlPlane(tmp_path_factory.mktemp("realnode-plane"), address=HOST_IP)
    node = RealNode(tmp_path_factory.mktemp("realnode"), plane)
    try:
        plane.start()
        node.start(images)
        yield Node(plane, node, before)
    finally:
        node.stop()  # idempotent: the last test stops it to compare the host's state
        plane.stop()
        delete_network()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A module's first test also sets up its node and may build the images (about 10 minutes
    on two cores the first time; scripts/test.sh builds them in a step before): more than the
    suite's per-test timeout."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.timeout(1800))
