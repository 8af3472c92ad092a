"""A stand-in cluster for operator tests: the emulator served over HTTP on 127.0.0.1 in a thread,
a kubeconfig pointing at it, the real `kvpilot operator` as a subprocess, and the controllers a
real cluster runs (Deployment controller, kubelet, garbage collector) played one pass at a time."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kmock
import yaml

from tests.operator.kube_emulator import Emulator, make_emulator

MD = "/apis/kvpilot.dev/v1alpha1/namespaces/{ns}/modeldeployments"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
PODS = "/api/v1/namespaces/{ns}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
CHILDREN = [
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/api/v1/namespaces/{ns}/services",
    "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "/api/v1/namespaces/{ns}/pods",
]
CONTAINER = {"name": "server", "image": "kvpilot:test", "imageID": "", "restartCount": 0}
READY_POD = {
    "phase": "Running",
    "conditions": [{"type": "Ready", "status": "True"}],
    "containerStatuses": [{**CONTAINER, "ready": True, "state": {"running": {}}}],
}


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def _is_ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class StandInCluster:
    def __init__(self, workdir: Path, namespace: str = "default") -> None:
        self.ns, self.kubeconfig = namespace, workdir / "kubeconfig"
        self.emulator: Emulator = make_emulator((namespace,))
        started, self._stop = threading.Event(), None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(started),))
        self._thread.daemon = True
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the API stand-in did not start")
        self.http = httpx.Client(base_url=self.url, timeout=10)
        self.operator: subprocess.Popen | None = None
        self.liveness = ""  # the operator's liveness URL, when it serves one

    async def _serve(self, started: threading.Event) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        async with self.emulator, kmock.Server(self.emulator, host="127.0.0.1") as server:
            self.url = str(server.url).rstrip("/")
            self._write_kubeconfig()
            started.set()
            await self._stop.wait()

    def _write_kubeconfig(self) -> None:
        context = {"cluster": "stand-in", "user": "stand-in", "namespace": self.ns}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": "stand-in"}}],
            "contexts": [{"name": "stand-in", "context": context}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    # -- the operator -------------------------------------------------------------------------

    def start_operator(
        self, log: Path, status_interval: float = 0.5, liveness: str = "", metrics_port: int = 0
    ) -> None:
        """`metrics_port` 0: no /metrics."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KVPILOT_IMAGE": "kvpilot:test"}
        env["KVPILOT_STATUS_INTERVAL_SECONDS"] = str(status_interval)
        cmd = [sys.executable, "-m", "kvpilot_server.cli", "operator", "--liveness", liveness]
        cmd += ["--metrics-port", str(metrics_port)]
        self._log = log.open("ab")
        self.operator = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_for_operator(self) -> None:
        """Until the operator watches ModelDeployments."""
        resource = "kvpilot.dev/v1alpha1/modeldeployments"
        wait_for(
            "the operator to watch ModelDeployments",
            lambda: any(r == resource for r in self.emulator.watched),
        )

    def stop_operator(self) -> None:
        if self.operator is None:
            return
        self.operator.send_signal(signal.SIGTERM)
        try:
            self.operator.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.operator.kill()
            self.operator.wait()
        self._log.close()
        self.operator = None

    def close(self) -> None:
        self.stop_operator()
        self.http.close()
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- REST ---------------------------------------------------------------------------------

    def path(self, template: str, name: str = "") -> str:
        return template.format(ns=self.ns) + (f"/{name}" if name else "")

    def get(self, template: str, name: str) -> dict | None:
        response = self.http.get(self.path(template, name))
        return response.json() if response.status_code == 200 else None

    def list(self, template: str) -> list[dict]:
        return self.http.get(self.path(template)).raise_for_status().json()["items"]

    def create(self, template: str, body: dict) -> dict:
        return self.http.post(self.path(template), json=body).raise_for_status().json()

    def patch(self, template: str, name: str, body: dict, subresource: str = "") -> dict:
        path = self.path(template, name) + (f"/{subresource}" if subresource else "")
        return self.http.patch(path, json=body, headers=MERGE).raise_for_status().json()

    def delete(self, template: str, name: str) -> None:
        self.http.delete(self.path(template, name))

    # -- controllers, one pass each -----------------------------------------------------------

    def run_deployment_controller(self, pod_status: dict | None = READY_POD) -> None:
        """Pods to match each Deployment (replaced when its template changes), every pod given
        `pod_status` (None: leave pod status to a kubelet), and the Deployment's status."""
        for deployment in self.list(DEPLOYMENTS):
            meta, spec = deployment["metadata"], deployment["spec"]
            revision = str(meta["generation"])
            mine = [
                p
                for p in self.list(PODS)
                if any(o["uid"] == meta["uid"] for o in p["metadata"].get("ownerReferences", []))
            ]
            current = [p for p in mine if p["metadata"]["annotations"]["revision"] == revision]
            for pod in [p for p in mine if p not in current] + current[spec["replicas"] :]:
                self.delete(PODS, pod["metadata"]["name"])
            for _ in range(spec["replicas"] - len(current)):
                self._create_pod(deployment, revision)
            if pod_status is not None:
                for pod in self.list(PODS):
                    if pod["metadata"]["annotations"].get("revision") == revision:
                        self.patch(PODS, pod["metadata"]["name"], {"status": pod_status}, "status")
            pods = [p for p in self.list(PODS) if p["metadata"]["name"].startswith(meta["name"])]
            ready = sum(1 for p in pods if _is_ready(p))
            status = {
                "observedGeneration": meta["generation"],
                "replicas": spec["replicas"],
                "updatedReplicas": spec["replicas"],
                "readyReplicas": min(ready, spec["replicas"]),
            }
            self.patch(DEPLOYMENTS, meta["name"], {"status": status}, "status")

    def _create_pod(self, deployment: dict, revision: str) -> None:
        meta, template = deployment["metadata"], deployment["spec"]["template"]
        owner = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
        pod_meta = {
            "generateName": f"{meta['name']}-",
            "labels": template["metadata"]["labels"],
            "annotations": {"revision": revision},
            "ownerReferences": [owner],
        }
        self.create(PODS, {"metadata": pod_meta, "spec": template["spec"]})

    def collect_garbage(self) -> int:
        """Delete objects whose owner is gone (children of ModelDeployments, then their pods)."""
        removed = 0
        for _ in range(2):  # Deployments go first, then the pods that pointed at them
            alive = {
                o["metadata"]["uid"] for template in [MD, *CHILDREN] for o in self.list(template)
            }
            for template in CHILDREN:
                for obj in self.list(template):
                    owners = obj["metadata"].get("ownerReferences", [])
                    if owners and not any(o["uid"] in alive for o in owners):
                        self.delete(template, obj["metadata"]["name"])
                        removed += 1
        return removed
