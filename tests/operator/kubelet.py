"""A kubelet for the stand-in: a real `kvpilot serve` (tiny model) for every Pod object, each on
its own 127.0.0.x address and the pod port, reported as the pod's IP once it is healthy."""

import threading
from pathlib import Path

from tests.operator.kube_cluster import CONTAINER, PODS, StandInCluster
from tests.server.api.live_server import start_tiny_server, stop_server

PORT = 8000


class Kubelet:
    def __init__(self, cluster: StandInCluster, model_dir: Path, *server_args: str) -> None:
        self.cluster, self.model_dir, self.server_args = cluster, model_dir, server_args
        self.servers: dict[str, tuple[object, str]] = {}  # pod name -> (process, address)
        self._next = 20
        self.lock = threading.Lock()

    def sync(self) -> None:
        pods = {p["metadata"]["name"]: p for p in self.cluster.list(PODS)}
        for name in [n for n in self.servers if n not in pods]:
            process, _ = self.servers.pop(name)
            stop_server(process)
        for name in [n for n in pods if n not in self.servers]:
            address = f"127.0.0.{self._next}"
            self._next += 1
            process, _ = start_tiny_server(
                self.model_dir, *self.server_args, host=address, port=PORT
            )
            self.servers[name] = (process, address)
            status = {
                "phase": "Running",
                "podIP": address,
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{**CONTAINER, "ready": True, "state": {"running": {}}}],
            }
            self.cluster.patch(PODS, name, {"status": status}, "status")

    def addresses(self) -> list[str]:
        return [address for _, address in list(self.servers.values())]

    def stop(self) -> None:
        for process, _ in self.servers.values():
            stop_server(process)
        self.servers.clear()
