"""reconcile() carries out render()'s plan and decides nothing itself: the objects applied in
the plan's order, then the children it deletes; a refused child stops it there; a spec that
cannot fit touches nothing. The cluster is a recorder here (the _live tests use a real one)."""

import kopf
import pytest
from lightkube import ApiError

from kvpilot_operator import handlers, rejection

SPEC = {"model": {"source": "builtin://smollm2-135m-instruct"}, "resources": {"gpus": 0}}


class _Status:
    def __init__(self, code: int, message: str) -> None:
        self.code, self.message = code, message

    def to_dict(self) -> dict:
        return {"kind": "Status", "code": self.code, "reason": "Invalid", "message": self.message}


class _Refused(ApiError):
    def __init__(self, code: int, message: str) -> None:  # no HTTP response behind it
        self.status = _Status(code, message)


class _Cluster:
    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse = refuse

    def apply(self, obj: dict) -> None:
        if obj["kind"] == self.refuse:
            raise _Refused(422, f'{obj["kind"]} "m" is invalid: spec: bad')
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"  # adopted first
        self.calls.append(("apply", obj["kind"]))

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        self.calls.append(("delete", f"{kind}/{namespace}/{name}"))
        return False


def _reconcile(monkeypatch, fake: _Cluster, patch: kopf.Patch, **spec) -> list:
    monkeypatch.setattr(handlers, "cluster", lambda: fake)
    meta = {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 2}
    body = {"apiVersion": "kvpilot.dev/v1alpha1", "kind": "ModelDeployment", "metadata": meta}
    handlers._reconcile(kopf.Body({**body, "spec": {**SPEC, **spec}}), patch)
    return fake.calls


# Without spec.adapters the plan deletes any adapter list left from an earlier spec: level-
# triggered, so a list emptied while the operator was down goes too.
def test_one_replica_applies_deployment_then_service_and_deletes_the_budget(monkeypatch):
    assert _reconcile(monkeypatch, _Cluster(), kopf.Patch(), replicas=1) == [
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("delete", "ConfigMap/ns/m-adapters"),
        ("delete", "PodDisruptionBudget/ns/m"),
    ]


def test_two_replicas_apply_a_budget_and_delete_only_an_adapter_list(monkeypatch):
    assert _reconcile(monkeypatch, _Cluster(), kopf.Patch(), replicas=2) == [
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply", "PodDisruptionBudget"),
        ("delete", "ConfigMap/ns/m-adapters"),
    ]


def test_adapters_apply_their_list_after_the_deployment(monkeypatch):
    adapters = [{"name": "tone", "source": "hf://org/tone"}]
    assert _reconcile(monkeypatch, _Cluster(), kopf.Patch(), replicas=1, adapters=adapters) == [
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply", "ConfigMap"),
        ("delete", "PodDisruptionBudget/ns/m"),
    ]


def test_a_refused_deployment_stops_the_plan_and_is_recorded(monkeypatch):
    fake, patch = _Cluster(refuse="Deployment"), kopf.Patch()
    with pytest.raises(kopf.PermanentError, match="refused the Deployment"):
        _reconcile(monkeypatch, fake, patch, replicas=1)
    assert fake.calls == []  # no Service, and the budget is not deleted either
    recorded = rejection.read(patch["metadata"]["annotations"])
    assert recorded is not None and recorded.kind == "Deployment"


def test_a_spec_that_cannot_fit_touches_no_child(monkeypatch):
    source = {"source": "pvc://store/../.."}
    assert _reconcile(monkeypatch, _Cluster(), kopf.Patch(), model=source) == []
