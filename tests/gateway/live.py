"""What the gateway's live tests share: a ModelDeployment spec, a replica's counter, and the
running parts."""

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common.naming import INSTANCE_LABEL, MANAGED_BY
from kvpilot_testing.kube.cluster import MD, PODS, Cluster, wait_for
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.node import PORT, Node
from kvpilot_testing.live_server import stop_side_by_side


def spec(replicas: int, autoscaling: bool = True, **scaling: object) -> dict:
    """A ModelDeployment spec on CPU; with autoscaling, from zero to two replicas."""
    body: dict = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
        "replicas": replicas,
    }
    if autoscaling:
        body["autoscaling"] = {
            "enabled": True,
            "minReplicas": 0,
            "maxReplicas": 2,
            "targetQueueDepth": 4,
            "windowSeconds": 30,
            "intervalSeconds": 2,
            **scaling,
        }
    return body


def create_model(cluster: Cluster, name: str, served: str | None = None, replicas: int = 0) -> None:
    """A ModelDeployment: at zero with autoscaling, or `replicas` without."""
    body = spec(replicas, autoscaling=replicas == 0)
    if served:
        body["model"]["servedModelName"] = served
    cluster.create(MD, {"metadata": {"name": name}, "spec": body})


def create_pod(cluster: Cluster, model: str, served: str) -> None:
    """The pod the operator would make for `model` (its labels, its port, its served name),
    made directly: for tests that need replicas, not the operator's reconcile."""
    labels = {MANAGED_BY[0]: MANAGED_BY[1], INSTANCE_LABEL: model}
    container = {
        "name": "server",
        "image": "kvpilot:test",
        "args": [f"--served-model-name={served}"],
        "ports": [{"name": "http", "containerPort": PORT}],
    }
    pod = {
        "metadata": {"name": f"{model}-0", "labels": labels},
        "spec": {"containers": [container]},
    }
    cluster.create(PODS, pod)


def wait_ready(gateway: Gateway, name: str, replicas: int = 1, headers: dict | None = None) -> None:
    """Until the gateway lists `name` with `replicas` ready replicas (each answers by then: the
    node reports a pod ready once its server does)."""

    def ready() -> bool:
        cards = httpx.get(f"{gateway.url}/v1/models", headers=headers, timeout=5).json()["data"]
        return any(c["id"] == name and c["ready_replicas"] >= replicas for c in cards)

    wait_for(
        f"{replicas} ready replicas of {name} at the gateway", ready, timeout=120, interval=0.1
    )


def pod_metric(address: str, name: str, **labels: str) -> float:
    """A model server pod's metric `name` from its /metrics, summed over its samples whose
    labels include `labels`."""
    return metric_at(f"http://{address}:{PORT}", name, **labels)


def metric_at(base_url: str, name: str, **labels: str) -> float:
    """A server's metric `name` from its /metrics, summed over its samples whose labels
    include `labels`."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


class Live:
    def __init__(self, cluster: Cluster, kubeconfig: Path, tmp: Path) -> None:
        self.cluster, self.kubeconfig, self.tmp = cluster, kubeconfig, tmp
        self.node: Node | None = None
        self.gateways: list[Gateway] = []
        self.pod_args: Callable[[int], Sequence[str]] = lambda _: ()  # by pod number: 0, 1, ...
        self._pods: list[str] = []

    def args_for(self, pod: dict) -> Sequence[str]:
        self._pods.append(pod["metadata"]["name"])
        return self.pod_args(len(self._pods) - 1)

    def process(self, pod_number: int):
        """The server process behind the n-th pod started."""
        assert self.node is not None
        return self.node.servers[self._pods[pod_number]][0]

    def address(self, pod_number: int) -> str:
        assert self.node is not None
        return self.node.servers[self._pods[pod_number]][1]

    def gateway(self, *args: str, start: bool = True, env: dict | None = None) -> Gateway:
        log = self.tmp / f"gateway-{len(self.gateways)}.log"
        gateway = Gateway(self.kubeconfig, self.cluster.ns, log, *args, env=env)
        self.gateways.append(gateway)
        return gateway.start() if start else gateway

    def operator(self) -> None:
        """An operator acting here from now on: the session's, where it watches this
        namespace already, or a private one."""
        if not self.cluster.shared:
            self.cluster.start_operator(self.tmp / "operator.log")
            self.cluster.wait_for_operator()


def live_of_test(env: Live) -> Iterator[Live]:
    """A module's Live for one test: the gateways the test starts stop after it."""
    first = len(env.gateways)
    try:
        yield env
    finally:
        stop_side_by_side([gateway.stop for gateway in env.gateways[first:]])
        show_logs(env.gateways[first:])


def show_logs(gateways: list[Gateway]) -> None:
    for gateway in gateways:  # printed: pytest shows them when the test fails
        print(f"--- {gateway.log_path.name}\n{gateway.log()[-3000:]}")
