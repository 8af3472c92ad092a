"""The chart installed into the real control plane with the real `helm` CLI, and the operator's
credentials as its pod would have them: a token of the chart's ServiceAccount."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.paths import CHART

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


def install(plane: ControlPlane, *values: str, release: str = RELEASE) -> Installed:
    """`helm install` (no --wait: no pod of the operator's own Deployment ever runs here), the
    CRD Established, and a kubeconfig with a token for the operator's ServiceAccount."""
    helm(plane, "install", release, str(CHART), "-n", NAMESPACE, "--create-namespace", *values)
    wait_for_crd(plane)
    token = plane.service_account_token(NAMESPACE, f"{release}-operator")
    path = plane.write_kubeconfig(plane.dir / f"{release}-operator.kubeconfig", token)
    user = f"system:serviceaccount:{NAMESPACE}:{release}-operator"
    return Installed(plane, path, user)
