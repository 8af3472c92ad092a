"""One namespace of the real control plane as a test sees it: the admin's REST calls on its
objects, and the real `kvpilot operator` as a subprocess, run as the chart runs it (every
namespace, or those given) under the kubeconfig it is given (the chart's ServiceAccount, so the
chart's RBAC applies to every call it makes)."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.live_server import free_port

MD = "/apis/kvpilot.dev/v1alpha1/namespaces/{ns}/modeldeployments"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
SERVICES = "/api/v1/namespaces/{ns}/services"
PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
PODS = "/api/v1/namespaces/{ns}/pods"
EVENTS = "/api/v1/namespaces/{ns}/events"
CONFIGMAPS = "/api/v1/namespaces/{ns}/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}
# What create() fills in when a test's body leaves it out (the API server needs it on custom
# resources).
TYPES = {
    MD: ("kvpilot.dev/v1alpha1", "ModelDeployment"),
    DEPLOYMENTS: ("apps/v1", "Deployment"),
    SERVICES: ("v1", "Service"),
    PDBS: ("policy/v1", "PodDisruptionBudget"),
    PODS: ("v1", "Pod"),
    CONFIGMAPS: ("v1", "ConfigMap"),
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


def create_namespace(plane: ControlPlane, name: str) -> None:
    with plane.client() as http:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        http.post("/api/v1/namespaces", json=body).raise_for_status()
    # Pods need the namespace's default ServiceAccount (the ServiceAccount admission plugin).
    plane.wait_for(
        f"the default ServiceAccount in {name}",
        lambda: plane.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
    )


class Cluster:
    def __init__(self, plane: ControlPlane, namespace: str, operator_kubeconfig: Path) -> None:
        self.plane, self.ns = plane, namespace
        self.kubeconfig = operator_kubeconfig
        self.http = plane.client()
        self.operator: subprocess.Popen | None = None
        self.liveness = ""  # the operator's liveness URL

    # -- the operator -------------------------------------------------------------------------

    def start_operator(
        self, log: Path, metrics_port: int = 0, namespaces: tuple[str, ...] = ()
    ) -> None:
        """`metrics_port` 0: no /metrics. No `namespaces`: it watches all (the chart's scope
        All, installed for the session); tests clean their namespace up before it stops."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KVPILOT_IMAGE": "kvpilot:test"}
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        cmd = [sys.executable, "-m", "kvpilot_common.cli", "operator"]
        cmd += [f"--namespace={n}" for n in namespaces]
        cmd += ["--liveness", self.liveness, "--metrics-port", str(metrics_port)]
        self._log = log.open("ab")
        self.operator = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_for_operator(self) -> None:
        """Until kopf runs (its liveness endpoint answers). A real API server hands the
        operator, when it starts watching, every object made before: nothing else to wait for."""

        def alive() -> bool:
            if self.operator is not None and self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.operator.returncode}")
            try:
                return httpx.get(self.liveness, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("the operator's liveness endpoint", alive, timeout=60, interval=0.2)

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

    def delete_model_deployments(self, timeout: float = 30) -> None:
        """Delete every ModelDeployment here and wait until they are gone, so that no later
        test's operator inherits them. With an operator running, its finalizer lets each go
        once the operator has seen the deletion; without one, a finalizer an earlier operator
        left is cleared by a patch (starting an operator only to clear it costs seconds)."""
        for md in self.list(MD):
            self.delete(MD, md["metadata"]["name"])
        if self.operator is None:
            for md in self.list(MD):
                if md["metadata"].get("finalizers"):  # a 404: it went meanwhile, as wanted
                    path = self.path(MD, md["metadata"]["name"])
                    self.http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE)
        wait_for("the ModelDeployments to go", lambda: not self.list(MD), timeout)

    def close(self) -> None:
        self.stop_operator()
        self.http.close()

    # -- REST ---------------------------------------------------------------------------------

    def path(self, template: str, name: str = "") -> str:
        return template.format(ns=self.ns) + (f"/{name}" if name else "")

    def get(self, template: str, name: str) -> dict | None:
        response = self.http.get(self.path(template, name))
        return response.json() if response.status_code == 200 else None

    def list(self, template: str) -> list[dict]:
        return self.http.get(self.path(template)).raise_for_status().json()["items"]

    def create(self, template: str, body: dict) -> dict:
        api_version, kind = TYPES[template]
        body = {"apiVersion": api_version, "kind": kind, **body}
        response = self.http.post(self.path(template), json=body)
        if response.is_error:  # the API server's own words, not only the status code
            raise AssertionError(f"{response.status_code} creating {kind}: {response.text}")
        return response.json()

    def patch(self, template: str, name: str, body: dict, subresource: str = "") -> dict:
        path = self.path(template, name) + (f"/{subresource}" if subresource else "")
        return self.http.patch(path, json=body, headers=MERGE).raise_for_status().json()

    def delete(self, template: str, name: str) -> None:
        self.http.delete(self.path(template, name))
