"""What the gateway's live tests share: a ModelDeployment spec, and the running parts."""

from pathlib import Path

from kvpilot_testing.kube.cluster import Cluster
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.node import Node


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


class Live:
    def __init__(self, cluster: Cluster, node: Node, kubeconfig: Path, tmp: Path) -> None:
        self.cluster, self.node, self.kubeconfig, self.tmp = cluster, node, kubeconfig, tmp
        self.gateways: list[Gateway] = []

    def gateway(self, *args: str, start: bool = True) -> Gateway:
        log = self.tmp / f"gateway-{len(self.gateways)}.log"
        gateway = Gateway(self.kubeconfig, self.cluster.ns, log, *args)
        self.gateways.append(gateway)
        return gateway.start() if start else gateway

    def operator(self) -> None:
        self.cluster.start_operator(self.tmp / "operator.log")
        self.cluster.wait_for_operator()
