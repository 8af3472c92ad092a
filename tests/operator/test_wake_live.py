"""Scale from zero on the real control plane with the real operator: a ModelDeployment at zero
replicas wakes when a gateway's held-requests annotation (kvpilot_common.demand) says requests
wait for it, at once, from the watch event (the periodic autoscaler is set to a long interval
here, so only the event handler can be what woke it). A stale entry (its gateway gone) wakes
nothing, nor does demand for a model whose autoscaling is off. No node is needed: the test
reads spec.replicas and the Deployment's replicas, not pods.

"Once" is counted in scale writes, from the API server's audit log, not in Events: the
operator announces each scale once, but kopf posts an Event with a generated name and retries
the POST after a 5xx or a dropped connection, so a post the API server stored before failing
(an etcd timeout under load) is stored twice, with the same message. Nothing merges them: the
API server keeps every Event it is given (the series and count of an Event are client-go's
recorder's doing, which kopf does not have)."""

import asyncio
import logging
import time

from lightkube import Client, KubeConfig

from kvpilot_common import demand
from kvpilot_operator import autoscale_writes, wake
from kvpilot_operator import cluster as operator_cluster
from kvpilot_testing.kube.cluster import DEPLOYMENTS, EVENTS, MD, Cluster, wait_for

AUTOSCALING = {
    "enabled": True,
    "minReplicas": 0,
    "maxReplicas": 3,
    "targetQueueDepth": 2,
    "windowSeconds": 10,
    "intervalSeconds": 600,  # the periodic autoscaler's next step is far away
}
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 0,
    "autoscaling": AUTOSCALING,
}
# Long enough for the operator to act on an event it would act on (it does so in well under
# a second); what must not happen is then checked after this.
QUIET_S = 3.0


def _create(cluster: Cluster, name: str, autoscaling: dict) -> None:
    cluster.create(MD, {"metadata": {"name": name}, "spec": {**SPEC, "autoscaling": autoscaling}})
    # The operator has seen it once its children exist: the Deployment, at zero replicas.
    wait_for(
        "the Deployment at 0",
        lambda: (cluster.get(DEPLOYMENTS, name) or {}).get("spec", {}).get("replicas") == 0,
    )
    if autoscaling["enabled"]:  # and the autoscaler's first step is done, holding at zero
        wait_for(
            "the autoscaler's first step",
            lambda: cluster.get(MD, name).get("status", {}).get("autoscaling"),
        )


def _hold(cluster: Cluster, name: str, held: int, when: float, gateway: str = "gw-1") -> None:
    """What a gateway writes when its held requests for the model change."""
    annotations = {demand.annotation_key(gateway): demand.encode(held, when)}
    cluster.patch(MD, name, {"metadata": {"annotations": annotations}})


def _replicas(cluster: Cluster, name: str) -> int:
    return cluster.get(MD, name)["spec"]["replicas"]


def _scale_writes(kube, cluster: Cluster, name: str) -> int:
    """The operator's writes of the model's replicas that the API server carried out."""
    scale = {"namespace": cluster.ns, "name": name, "subresource": "scale"}
    return sum(
        1
        for e in kube.plane.audit(kube.operator_user)
        if e["stage"] == "ResponseComplete"
        and e["verb"] == "patch"
        and scale.items() <= (e.get("objectRef") or {}).items()  # none on a non-resource URL
        and e["responseStatus"]["code"] == 200
    )


def _scaled_up(cluster: Cluster, name: str) -> list[dict]:
    return [
        e
        for e in cluster.list(EVENTS)
        if e["reason"] == "ScaledUp" and e["involvedObject"]["name"] == name
    ]


def test_held_requests_wake_a_model_at_zero_at_once(kube, cluster):
    _create(cluster, "sleepy", AUTOSCALING)
    _create(cluster, "other", AUTOSCALING)  # wanted by no one: stays at zero

    start = time.monotonic()
    _hold(cluster, "sleepy", 2, time.time())
    # Within 30 s, where the periodic autoscaler's next step is 600 s away: the event did it.
    wait_for(
        "spec.replicas 1", lambda: _replicas(cluster, "sleepy") == 1, timeout=30, interval=0.02
    )
    woke_s = time.monotonic() - start
    print(f"annotation written -> spec.replicas 1: {woke_s * 1000:.0f} ms")
    wait_for(
        "the Deployment at 1",
        lambda: cluster.get(DEPLOYMENTS, "sleepy")["spec"]["replicas"] == 1,
        timeout=10,
    )
    wait_for("a ScaledUp Event", lambda: _scaled_up(cluster, "sleepy"), timeout=10)

    # More held requests once awake: the event handler leaves it to the autoscaler (its
    # stabilization and pods' metrics), so one burst of gateway writes scales once.
    _hold(cluster, "sleepy", 6, time.time())
    time.sleep(QUIET_S)
    assert _replicas(cluster, "sleepy") == 1 and _scale_writes(kube, cluster, "sleepy") == 1
    # That one scale announced: a post kopf retried repeats it, word for word (module doc).
    announced = {(e["type"], e["message"]) for e in _scaled_up(cluster, "sleepy")}
    assert announced == {("Normal", "2 requests held at the gateway: 0 -> 1")}
    assert _replicas(cluster, "other") == 0 and _scale_writes(kube, cluster, "other") == 0


def test_a_stale_entry_wakes_nothing_a_fresh_one_does(cluster):
    # A short interval: neither the event handler nor the periodic autoscaler may wake it.
    _create(cluster, "stale", {**AUTOSCALING, "intervalSeconds": 1})
    _hold(cluster, "stale", 4, time.time() - 300, gateway="gone")
    time.sleep(QUIET_S)
    assert _replicas(cluster, "stale") == 0 and not _scaled_up(cluster, "stale")
    status = cluster.get(MD, "stale")["status"]["autoscaling"]
    assert status["observed"]["heldRequests"] == 0

    _hold(cluster, "stale", 3, time.time())  # a live gateway: 2 replicas for 3 requests
    wait_for("spec.replicas 2", lambda: _replicas(cluster, "stale") == 2, timeout=10)
    wait_for(
        "heldRequests in status",
        lambda: cluster.get(MD, "stale")["status"]["autoscaling"]["observed"]["heldRequests"] == 3,
        timeout=10,
    )


def test_a_model_turned_off_is_not_woken(cluster):
    _create(cluster, "off", {**AUTOSCALING, "enabled": False})
    _hold(cluster, "off", 2, time.time())
    time.sleep(QUIET_S)
    assert _replicas(cluster, "off") == 0 and not _scaled_up(cluster, "off")

    # The same demand wakes it once its user turns autoscaling on.
    cluster.patch(MD, "off", {"spec": {"autoscaling": {**AUTOSCALING, "enabled": True}}})
    wait_for("spec.replicas 1", lambda: _replicas(cluster, "off") == 1, timeout=10)


def test_a_wake_from_an_event_older_than_the_last_write_scales_nothing(
    kube_namespace, monkeypatch, request
):
    """The handler itself, in this process, on the real API server under the operator's
    ServiceAccount (no operator runs, so nothing else writes): given the body of an event that
    was queued before a later write, its conditional scale patch is refused with 409 and it
    neither scales nor announces; given the current body, it wakes the model once."""
    client = Client(KubeConfig.from_file(kube_namespace.kubeconfig), field_manager="test-wake")
    monkeypatch.setattr(autoscale_writes, "cluster", lambda: operator_cluster.Cluster(client))
    request.addfinalizer(client.close)
    announced: list[str] = []
    monkeypatch.setattr(
        autoscale_writes.kopf, "event", lambda md, **kw: announced.append(kw["message"])
    )
    kube_namespace.create(MD, {"metadata": {"name": "raced"}, "spec": SPEC})
    _hold(kube_namespace, "raced", 2, time.time())
    stale = kube_namespace.get(MD, "raced")
    # A later write (a status patch, another gateway's annotation) the stale event predates.
    _hold(kube_namespace, "raced", 2, time.time(), gateway="gw-2")
    log = logging.getLogger("test-wake")

    asyncio.run(wake.wake_on_demand(body=stale, logger=log))
    assert _replicas(kube_namespace, "raced") == 0 and announced == []

    asyncio.run(wake.wake_on_demand(body=kube_namespace.get(MD, "raced"), logger=log))
    assert _replicas(kube_namespace, "raced") == 2  # 4 held, a target queue depth of 2
    assert announced == ["4 requests held at the gateway: 0 -> 2"]
