"""One namespace of the real control plane as a test sees it: the admin's REST calls on its
objects, and the real `kvpilot operator` as a subprocess, run as the chart runs it (every
namespace, or those given) under the kubeconfig it is given (the chart's ServiceAccount, so the
chart's RBAC applies to every call it makes)."""

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpilot_testing.kube.controlplane import ControlPlane

if TYPE_CHECKING:
    from kvpilot_testing.kube.operator import Operator

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


_names: list[str] = []  # every namespace name used in this process, for unique new ones


def namespace_name(test: str, prefix: str = "") -> str:
    """A new namespace name for a test: `prefix`, its words, a count."""
    words = re.sub(r"[^a-z0-9]+", "-", test.lower()).strip("-")[:40].strip("-")
    name = f"{prefix}{words}-{len(_names)}"
    _names.append(name)
    return name


def delete_namespace(cluster: "Cluster") -> None:
    """Its pods deleted as a kubelet finishes them (no kubelet is left to), then the namespace:
    it goes at once instead of staying Terminating, so an operator watching it lets it go."""
    for pod in cluster.list(PODS):
        cluster.http.request(
            "DELETE", cluster.path(PODS, pod["metadata"]["name"]), json={"gracePeriodSeconds": 0}
        )
    cluster.http.delete(f"/api/v1/namespaces/{cluster.ns}")


class Cluster:
    def __init__(self, plane: ControlPlane, namespace: str, operator_kubeconfig: Path) -> None:
        self.plane, self.ns = plane, namespace
        self.kubeconfig = operator_kubeconfig
        self.http = plane.client()
        self._operator: Operator | None = None  # a private one
        self.shared = False  # the session's shared operator watches this namespace

    # -- the operator -------------------------------------------------------------------------

    @property
    def operator(self) -> subprocess.Popen | None:
        """The private operator's process, while one runs."""
        return self._operator.process if self._operator is not None else None

    @property
    def liveness(self) -> str:
        return self._operator.liveness if self._operator is not None else ""

    def start_operator(
        self, log: Path, metrics_port: int = 0, namespaces: tuple[str, ...] | None = None
    ) -> None:
        """A private operator: `metrics_port` 0: no /metrics; `namespaces` None: this one
        only, so that it never acts beside the session's shared operator (operator.py)."""
        from kvpilot_testing.kube.operator import Operator

        watched = (self.ns,) if namespaces is None else namespaces
        self._operator = Operator(self.kubeconfig, log, watched, metrics_port).start()

    def wait_for_operator(self) -> None:
        assert self._operator is not None
        self._operator.wait()

    def stop_operator(self) -> None:
        if self._operator is not None:
            self._operator.stop()
            self._operator = None

    def delete_model_deployments(self, timeout: float = 30) -> None:
        """Delete every ModelDeployment here and wait until they are gone, so that no later
        test's operator inherits them. With an operator running (a private one, or the shared
        one watching here), its finalizer lets each go once the operator has seen the
        deletion; without one, a finalizer an earlier operator left is cleared by a patch
        (starting an operator only to clear it costs seconds)."""
        for md in self.list(MD):
            self.delete(MD, md["metadata"]["name"])
        if self.operator is None and not self.shared:
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
