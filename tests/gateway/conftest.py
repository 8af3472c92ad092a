"""Fixtures of the gateway's live tests: a namespace of the real control plane, the real
operator, the test's kubelet running a real `kvpilot serve` (tiny model) per pod, and real
`kvpilot gateway` processes; everything stopped by PID afterwards."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpilot_testing.kube.cluster import Cluster
from kvpilot_testing.kube.node import Node, serve_tiny
from kvpilot_testing.kube.operator import namespace
from tests.gateway.live import Live


@pytest.fixture
def live_watched() -> bool:
    """Whether the session's operator watches the test's namespace from the start (a module
    whose operator is only infrastructure says True); otherwise no operator acts there until
    the test calls live.operator(), which starts a private one."""
    return False


@pytest.fixture
def live(kube, live_watched, request, tmp_path, tiny_dir) -> Iterator[Live]:
    with namespace(kube, request.node.name, watched=live_watched) as cluster:
        yield from _live(kube, cluster, tmp_path, tiny_dir)


def _live(kube, cluster: Cluster, tmp_path, tiny_dir) -> Iterator[Live]:
    kubeconfig = getattr(kube, "gateway_kubeconfig", None) or kube.plane.kubeconfig
    env = Live(cluster, kubeconfig, tmp_path)
    # The pod's extra server flags are looked up when it starts: a test sets live.pod_args
    # before making its ModelDeployment.
    node = env.node = Node(cluster, *serve_tiny(tiny_dir("llama"), extra_args=env.args_for))
    node.start(interval=0.1)  # a pod binds, and turns ready, at the next pass
    try:
        yield env
        cluster.delete_model_deployments()  # without an operator, no finalizer waits for one
    finally:
        # Every process stopped side by side: each takes a moment to exit, and one after
        # another the teardown waited out each in turn. The node starts nothing once stopped,
        # whatever the operator still does.
        stops = [gateway.stop for gateway in env.gateways] + [node.stop, cluster.stop_operator]
        with ThreadPoolExecutor(len(stops)) as pool:
            list(pool.map(lambda stop: stop(), stops))  # list(): a stop that raised raises
        for gateway in env.gateways:
            print(f"--- {gateway.log_path.name}\n{gateway.log()[-3000:]}")
        operator_log = tmp_path / "operator.log"
        if operator_log.exists():
            print(operator_log.read_text()[-3000:])
        print("node errors:", node.errors[-5:])
