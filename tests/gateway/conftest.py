"""Fixtures of the gateway's live tests: a namespace of the real control plane, the real
operator, the test's kubelet running a real `kvpilot serve` (tiny model) per pod, and real
`kvpilot gateway` processes; everything stopped by PID afterwards."""

from collections.abc import Iterator

import pytest

from kvpilot_testing.kube.node import Node, serve_tiny
from tests.gateway.live import Live


@pytest.fixture
def live(kube, kube_namespace, tmp_path, tiny_dir) -> Iterator[Live]:
    """Operator not started: a test calls live.operator() when it wants it."""
    cluster = kube_namespace
    kubeconfig = getattr(kube, "gateway_kubeconfig", None) or kube.plane.kubeconfig
    env = Live(cluster, kubeconfig, tmp_path)
    # The pod's extra server flags are looked up when it starts: a test sets live.pod_args
    # before making its ModelDeployment.
    node = env.node = Node(cluster, *serve_tiny(tiny_dir("llama"), extra_args=env.args_for))
    node.start(interval=0.2)
    try:
        yield env
        cluster.delete_model_deployments()  # without an operator, no finalizer waits for one
    finally:
        for gateway in env.gateways:
            gateway.stop()
        node.stop()
        cluster.stop_operator()
        for gateway in env.gateways:
            print(f"--- {gateway.log_path.name}\n{gateway.log()[-3000:]}")
        operator_log = tmp_path / "operator.log"
        if operator_log.exists():
            print(operator_log.read_text()[-3000:])
        print("node errors:", node.errors[-5:])
