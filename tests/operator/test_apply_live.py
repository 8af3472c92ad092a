"""Children by server-side apply, against the real API server: what the operator no longer
renders leaves the child, what another field manager wrote stays, and an unchanged child is not
written at all. A merge patch (what the operator sent before) leaves absent keys untouched, so
an hf:// -> pvc:// change kept the download init container and a removed toleration stayed."""

from pathlib import Path

from kvpilot_testing.kube.cluster import DEPLOYMENTS, MD, wait_for

MERGE = {"Content-Type": "application/merge-patch+json"}
KEEP = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
DROP = {"key": "pool", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
SPEC = {
    "model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "scheduling": {"nodeSelector": {"zone": "a", "disk": "ssd"}, "tolerations": [KEEP, DROP]},
}


def _pod_spec(cluster, name: str) -> dict:
    return cluster.get(DEPLOYMENTS, name)["spec"]["template"]["spec"]


def test_removed_fields_leave_the_child_and_other_managers_fields_stay(
    own_operator, tmp_path: Path
):
    cluster = own_operator
    cluster.create(MD, {"metadata": {"name": "applied"}, "spec": SPEC})
    wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, "applied"))
    before = _pod_spec(cluster, "applied")
    assert [c["name"] for c in before["initContainers"]] == ["download"]
    assert before["nodeSelector"] == {"zone": "a", "disk": "ssd"}
    assert KEEP in before["tolerations"] and DROP in before["tolerations"]

    # Someone runs `kubectl annotate deployment applied team=search`: another field manager.
    path = cluster.path(DEPLOYMENTS, "applied") + "?fieldManager=kubectl-annotate"
    annotate = {"metadata": {"annotations": {"team": "search"}}}
    cluster.http.patch(path, json=annotate, headers=MERGE).raise_for_status()

    change = {
        "model": {"source": "pvc://model-store/smollm2"},
        "scheduling": {"nodeSelector": {"disk": None}, "tolerations": [KEEP]},
    }
    cluster.patch(MD, "applied", {"spec": change})

    def moved() -> bool:
        return "persistentVolumeClaim" in str(_pod_spec(cluster, "applied")["volumes"])

    wait_for("the Deployment to take the new source", moved)
    after = _pod_spec(cluster, "applied")
    assert "initContainers" not in after
    assert after["nodeSelector"] == {"zone": "a"}
    assert after["tolerations"] == [KEEP]
    deployment = cluster.get(DEPLOYMENTS, "applied")
    assert deployment["metadata"]["annotations"]["team"] == "search"
    managers = {m["manager"] for m in deployment["metadata"]["managedFields"]}
    assert {"kvpilot-operator", "kubectl-annotate"} <= managers

    # Nothing changed: a restarted operator re-applies every child (kopf's resume) and the
    # API server writes nothing of ours. (Not the resourceVersion: the Deployment controller
    # keeps writing the status of a rollout whose pods never run here.)
    mine = _applied(deployment)
    cluster.stop_operator()
    cluster.start_operator(tmp_path / "operator-2.log")
    cluster.wait_for_operator()
    wait_for(
        "the resumed reconcile",
        lambda: "Resuming is processed" in (tmp_path / "operator-2.log").read_text(),
    )
    assert _applied(cluster.get(DEPLOYMENTS, "applied")) == mine


def _applied(deployment: dict) -> tuple:
    """The generation (every spec write moves it) and the time of our manager's last apply
    (any write of our fields moves it)."""
    entry = next(
        m for m in deployment["metadata"]["managedFields"] if m["manager"] == "kvpilot-operator"
    )
    return deployment["metadata"]["generation"], entry["operation"], entry["time"]
