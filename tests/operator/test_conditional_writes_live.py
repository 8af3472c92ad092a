"""The status refresh's and the autoscaler's writes are conditional on the version they were
decided from (conflicts.py), in this process on the real API server under the operator's
ServiceAccount (no operator runs, so nothing else writes): from a read older than the last
write, nothing is written or announced; from the current one, the write lands once. What two
replicas acting at once would do to each other (tests/chart/test_chart_peering_live.py runs
them)."""

import pytest
from lightkube import Client, KubeConfig

from kvpilot_operator import autoscale_writes, crd, handlers
from kvpilot_operator import cluster as operator_cluster
from kvpilot_operator.decide import Decision, Inputs
from kvpilot_testing.kube.cluster import MD

SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 1,
    "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetQueueDepth": 2},
}
UP = Decision(2, 2, "queue 4.0/replica vs target 2: 1 -> 2", False, [(1.0, 2)])
INPUTS = Inputs(current=1, starting=0, pods_scraped=1, scrape_failures=0, queue_per_replica=4.0,
                p95_ms=None, finished=1.0)  # fmt: skip


@pytest.fixture
def writes(kube_namespace, monkeypatch, request) -> list[str]:
    """The operator's client for both writers; the Events they would post, by reason."""
    client = Client(KubeConfig.from_file(kube_namespace.kubeconfig), field_manager="test-cas")
    request.addfinalizer(client.close)
    for module in (handlers, autoscale_writes):
        monkeypatch.setattr(module, "cluster", lambda: operator_cluster.Cluster(client))
    announced: list[str] = []
    monkeypatch.setattr(handlers.kopf, "event", lambda body, **kw: announced.append(kw["reason"]))
    return announced


def _write(md: dict, *, scaled: bool = False) -> None:
    autoscale_writes.write(md, INPUTS, UP, {}, 1.0, 1, 1, scaled=scaled)


def test_a_status_refresh_from_a_stale_read_writes_and_announces_nothing(kube_namespace, writes):
    kube_namespace.create(MD, {"metadata": {"name": "stale"}, "spec": SPEC})
    stale = crd.defaulted(kube_namespace.get(MD, "stale"))
    kube_namespace.patch(MD, "stale", {"status": {"replicas": 7}}, "status")  # another writer

    assert handlers.report(stale, None, []) is False
    assert kube_namespace.get(MD, "stale")["status"] == {"replicas": 7} and writes == []

    assert handlers.report(kube_namespace.get(MD, "stale"), None, []) is True
    status = kube_namespace.get(MD, "stale")["status"]
    assert status["replicas"] == 0 and "conditions" in status
    assert writes and len(writes) == len(set(writes))  # each condition announced once
    written = list(writes)
    assert handlers.report(kube_namespace.get(MD, "stale"), None, []) is False  # nothing new
    assert writes == written


def test_an_autoscaler_step_from_a_stale_read_neither_scales_nor_records(kube_namespace, writes):
    kube_namespace.create(MD, {"metadata": {"name": "raced"}, "spec": SPEC})
    stale = crd.defaulted(kube_namespace.get(MD, "raced"))
    kube_namespace.patch(MD, "raced", {"spec": {"replicas": 3}})  # scaled since: a wake, a peer

    with pytest.raises(autoscale_writes.Stale) as refused:
        _write(stale)
    assert refused.value.scaled is False
    md = kube_namespace.get(MD, "raced")
    assert md["spec"]["replicas"] == 3 and "autoscaling" not in md.get("status", {})

    kube_namespace.patch(MD, "raced", {"spec": {"replicas": 1}})
    _write(crd.defaulted(kube_namespace.get(MD, "raced")))  # from the current read
    md = kube_namespace.get(MD, "raced")
    assert md["spec"]["replicas"] == 2 and writes == ["ScaledUp"]
    assert [(d["from"], d["to"]) for d in md["status"]["autoscaling"]["decisions"]] == [(1, 2)]

    # A try whose scale was made and whose record met a newer write: only the record is
    # written again (onto the newer object, by the step), never the scale.
    read = crd.defaulted(md)
    kube_namespace.patch(MD, "raced", {"status": {"replicas": 2}}, "status")  # the refresh
    with pytest.raises(autoscale_writes.Stale) as refused:
        _write(read, scaled=True)
    assert refused.value.scaled is True and writes == ["ScaledUp"]
