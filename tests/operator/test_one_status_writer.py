"""status.conditions has one writer. The status daemon (handlers.report) and the autoscaler's
step (autoscale_writes.write) both start from a snapshot of the object and merge-patch its status,
as they do in the operator; whichever lands second must not undo the first. The autoscaler
writes only status.autoscaling, and status() derives ScalingLimited from it."""

import copy

import kopf
import pytest

from kvpilot_operator import autoscale_writes, crd, handlers
from kvpilot_operator.decide import Decision, Inputs

SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "replicas": 2,
    "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 2, "targetQueueDepth": 4},
}
READY = {"conditions": [{"type": "Ready", "status": "True"}]}


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386, as the API server applies application/merge-patch+json: lists are replaced."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_patch(result[key], value)
        else:
            result[key] = value
    return result


class _Cluster:
    """cluster() as report() and write() use it: a client that records the status patches."""

    def __init__(self) -> None:
        self.patches: list[dict] = []
        self.client = self

    def patch(self, resource, name, body, namespace, patch_type) -> None:
        self.patches.append(body)

    def patch_status(self, name: str, namespace: str, status: dict, version=None) -> dict:
        self.patches.append({"status": status})
        return status


def _refresh(stored: dict, ready: int, monkeypatch) -> dict:
    """The status patch one refresh makes from `stored` with `ready` of 2 pods ready."""
    fake = _Cluster()
    monkeypatch.setattr(handlers, "cluster", lambda: fake)
    observed = {"replicas": 2, "readyReplicas": ready, "updatedReplicas": 2}
    deployment = {"metadata": {"generation": 1}, "status": {**observed, "observedGeneration": 1}}
    pods = [{"metadata": {"name": f"p-{i}"}, "status": READY} for i in range(ready)]
    handlers.report(stored, deployment, pods)
    return fake.patches[0] if fake.patches else {}


def _autoscale(stored: dict, monkeypatch) -> dict:
    """The status patch one autoscaler step makes from `stored`: held at 2, clamped by max 2."""
    fake = _Cluster()
    monkeypatch.setattr(autoscale_writes, "cluster", lambda: fake)
    inputs = Inputs(2, 0, 2, 0, 9.0, None, 1.0)
    decision = Decision(2, 3, "queue 9.0/replica vs target 4 (limited to 2..2)", True, [(1.0, 3)])
    autoscale_writes.write(crd.defaulted(stored), inputs, decision, {}, 1.0, 2, 2)
    (only,) = fake.patches
    return only


def _conditions(obj: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}


@pytest.fixture(autouse=True)
def _no_events(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: None)


@pytest.mark.parametrize("autoscaler_first", [False, True])
def test_a_refresh_and_an_autoscaler_step_from_one_snapshot_lose_nothing(
    autoscaler_first, monkeypatch
):
    meta = {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 1}
    stored = {"metadata": meta, "spec": SPEC}
    stored = merge_patch(stored, _refresh(stored, 1, monkeypatch))  # one of two pods ready
    assert _conditions(stored)["Ready"] == "False"

    # The second pod turns ready while the autoscaler is mid-step: both read `snapshot`.
    snapshot = copy.deepcopy(stored)
    patches = [_refresh(snapshot, 2, monkeypatch), _autoscale(snapshot, monkeypatch)]
    for patch in reversed(patches) if autoscaler_first else patches:
        stored = merge_patch(stored, patch)
        assert _conditions(stored)["Ready"] == "True" or patch is patches[1]
    assert _conditions(stored)["Ready"] == "True"  # the refresh's news was not undone
    assert stored["status"]["autoscaling"]["limited"] is True

    # The next refresh shows the clamp, and nothing flips back after it.
    stored = merge_patch(stored, _refresh(stored, 2, monkeypatch))
    assert _conditions(stored) == {
        "Ready": "True",
        "Progressing": "False",
        "Degraded": "False",
        "ScalingLimited": "True",
    }
    again = merge_patch(stored, _autoscale(stored, monkeypatch))
    assert _conditions(again) == _conditions(stored)
