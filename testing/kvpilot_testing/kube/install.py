"""The chart installed into the real control plane with the real `helm` CLI, and the credentials
the operator's and the gateway's pods would have: a token of each one's ServiceAccount."""

import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kvpilot_operator.permissions import CLUSTER_WHEN_NAMESPACED
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.paths import CHART

if TYPE_CHECKING:
    from kvpilot_testing.kube.operator import Operator

RELEASE, NAMESPACE = "kvpilot", "kvpilot-system"
CRD_NAME = "modeldeployments.kvpilot.dev"


def helm(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = [str(plane.bin / "helm"), *args, "--kubeconfig", str(plane.kubeconfig)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


def wait_for_crd(plane: ControlPlane) -> dict:
    def established() -> dict | None:
        crd = plane.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return crd
        return None

    return plane.wait_for("the ModelDeployment CRD to be Established", established)


@dataclass
class Installed:
    plane: ControlPlane
    operator_kubeconfig: Path  # the chart's ServiceAccount: only the chart's RBAC applies
    operator_user: str  # its name in the API server's audit log
    # The same for the gateway's own ServiceAccount; None when the release has no gateway
    # (gateway.enabled=false).
    gateway_kubeconfig: Path | None = None
    gateway_user: str | None = None
    operator: "Operator | None" = None  # the session's shared one (kube/operator.py)
    # When the release was installed (its ServiceAccounts made): on a plane that outlives its
    # releases (tests/chart), the audit events of this one's accounts are those received since,
    # as every release of the same name has accounts of the same names.
    since: datetime = field(default_factory=lambda: datetime.now(UTC))


def _kubeconfig(plane: ControlPlane, account: str) -> tuple[Path, str]:
    token = plane.service_account_token(NAMESPACE, account)
    path = plane.write_kubeconfig(plane.dir / f"{account}.kubeconfig", token)
    return path, f"system:serviceaccount:{NAMESPACE}:{account}"


def install(plane: ControlPlane, *values: str, release: str = RELEASE) -> Installed:
    """`helm install` (no --wait: no pod of the chart's Deployments ever runs here), the CRD
    Established, and kubeconfigs with a token for the operator's ServiceAccount and, when the
    release has one, the gateway's."""
    since = datetime.now(UTC)
    helm(plane, "install", release, str(CHART), "-n", NAMESPACE, "--create-namespace", *values)
    wait_for_crd(plane)
    installed = Installed(plane, *_kubeconfig(plane, f"{release}-operator"), since=since)
    gateway = f"{release}-gateway"
    if plane.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{gateway}") is not None:
        installed.gateway_kubeconfig, installed.gateway_user = _kubeconfig(plane, gateway)
    return installed


def observe_namespaces(plane: ControlPlane, release: str = RELEASE) -> None:
    """What the chart grants an operator watching named namespaces on top of a release that
    watches all (kube/operator.py: the shared operator's namespace pattern, and the private
    ones' own namespace, both watch by name): kopf's namespace observer, from the one
    declaration the chart's RBAC is generated from."""
    name = f"{release}-test-namespace-observer"
    rules = [
        {"apiGroups": [p.api_group], "resources": [p.resource], "verbs": list(p.verbs)}
        for p in CLUSTER_WHEN_NAMESPACED
    ]
    role = {"metadata": {"name": name}, "rules": rules}
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": f"{release}-operator", "namespace": NAMESPACE}
        ],
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    with plane.client() as http:
        http.post(f"{rbac}/clusterroles", json=role).raise_for_status()
        http.post(f"{rbac}/clusterrolebindings", json=binding).raise_for_status()
