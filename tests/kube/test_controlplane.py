"""The control plane the operator tests run on: what it is (the version scripts/controlplane.sh
pins, the admission and audit settings the tests rely on) and how it fails when it cannot
start (a clear error naming the cause, every process it started stopped)."""

import re
import stat

import pytest

from kvpilot_testing.kube.cluster import MD
from kvpilot_testing.kube.controlplane import ControlPlane, ControlPlaneError
from kvpilot_testing.paths import ROOT

BUILTIN = "builtin://smollm2-135m-instruct"


def test_the_session_control_plane_is_the_pinned_kubernetes(kube):
    pinned = re.search(
        r"^KUBERNETES_VERSION=(\S+)$", (ROOT / "scripts/controlplane.sh").read_text(), re.M
    )
    assert pinned
    version = kube.plane.get("/version")
    assert version is not None and version["gitVersion"] == pinned.group(1)
    # The audit log the permission tests read has the admin's requests.
    assert any(e["verb"] == "get" for e in kube.plane.audit("kvpilot-admin"))


def test_blocking_owner_deletion_needs_the_owners_finalizers_permission(kube, kube_namespace):
    """OwnerReferencesPermissionEnforcement runs (as on OpenShift): a ServiceAccount that may
    create ConfigMaps but not update modeldeployments/finalizers cannot block its owner's
    deletion; the chart grants the operator that permission (permissions.py)."""
    ns, http = kube_namespace.ns, kube_namespace.http
    md = kube_namespace.create(
        MD, {"metadata": {"name": "owner"}, "spec": {"model": {"source": BUILTIN}}}
    )
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    http.post(f"/api/v1/namespaces/{ns}/serviceaccounts", json={"metadata": {"name": "probe"}})
    http.post(f"{rbac}/roles", json={"metadata": {"name": "probe"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "probe"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "probe"},
        "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": ns}],
    }
    http.post(f"{rbac}/rolebindings", json=binding).raise_for_status()
    owner = {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "ModelDeployment",
        "name": "owner",
        "uid": md["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    token = kube.plane.service_account_token(ns, "probe")
    with kube.plane.client(token) as probe:
        for block in (True, False):
            meta = {"name": f"child-{block}".lower(), "ownerReferences": [{**owner}]}
            meta["ownerReferences"][0]["blockOwnerDeletion"] = block
            answer = probe.post(f"/api/v1/namespaces/{ns}/configmaps", json={"metadata": meta})
            if block:
                assert answer.status_code in (403, 422), answer.text
                assert "cannot set blockOwnerDeletion" in answer.json()["message"]
            else:
                assert answer.status_code == 201, answer.text


def test_missing_binaries_fail_clearly(tmp_path):
    plane = ControlPlane(tmp_path / "plane", bin_dir=tmp_path / "empty")
    with pytest.raises(
        ControlPlaneError, match=r"etcd, kube-apiserver, .* scripts/controlplane\.sh"
    ):
        plane.start()


def test_a_component_that_exits_fails_clearly_with_its_log(tmp_path, kube):
    """The real etcd, and an API server that cannot start: the error says which one, with the
    end of its log, at once rather than after the readiness timeout; etcd is stopped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("etcd", "kube-controller-manager"):
        (bin_dir / name).symlink_to(kube.plane.bin / name)
    broken = bin_dir / "kube-apiserver"
    broken.write_text(
        "#!/bin/sh\necho 'E1201 cannot bind 127.0.0.1: permission denied' >&2\nexit 3\n"
    )
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    plane = ControlPlane(tmp_path / "plane", bin_dir=bin_dir)
    try:
        with pytest.raises(ControlPlaneError) as failed:
            plane.start()
        message = str(failed.value)
        assert "kube-apiserver exited with 3" in message and "permission denied" in message
        etcd = plane.processes[0][1]
    finally:
        plane.stop()
    assert etcd.poll() is not None
