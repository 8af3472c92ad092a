"""Fixtures of the gateway's live tests: a namespace of the real control plane, the real
operator, the test's kubelet running a real `kvpilot serve` (tiny model) per pod, and real
`kvpilot gateway` processes; everything stopped by PID afterwards."""

from collections.abc import Iterator

import pytest

from kvpilot_testing.kube.cluster import Cluster
from kvpilot_testing.kube.node import Node, serve_tiny
from kvpilot_testing.kube.operator import namespace
from kvpilot_testing.live_server import stop_side_by_side
from tests.gateway.live import Live, show_logs


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


@pytest.fixture(scope="module")
def module_live(kube, request, tmp_path_factory, tiny_dir) -> Iterator[Live]:
    """One namespace and node, watched by the session's operator, for a module whose tests
    all leave them as they found them (the module says why): what its replicas cost to start
    is paid once. A test takes it through live.live_of_test."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    with namespace(kube, name, watched=True) as cluster:
        yield from _live(kube, cluster, tmp_path_factory.mktemp(name), tiny_dir)


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
        # The node starts nothing once stopped, whatever the operator still does.
        stops = [gateway.stop for gateway in env.gateways] + [node.stop, cluster.stop_operator]
        stop_side_by_side(stops)
        show_logs(env.gateways)
        operator_log = tmp_path / "operator.log"
        if operator_log.exists():
            print(operator_log.read_text()[-3000:])
        print("node errors:", node.errors[-5:])
