"""The operator's per-ModelDeployment gauges: kvpilot_operator_max_replicas next to desired,
current and ready while autoscaling is on, and every gauge's series gone once the ModelDeployment
is deleted or autoscaling is turned off (a stale series would keep alerts firing until the
operator restarts). First the autoscaler's step and daemon in-process, then the real operator's
/metrics against the real control plane, the test playing the node."""

import asyncio
import contextlib
import time

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_common.observe import Window
from kvpilot_operator import autoscaler, crd, handlers, metrics
from kvpilot_testing.kube.cluster import DEPLOYMENTS, MD, wait_for
from kvpilot_testing.kube.node import Node
from kvpilot_testing.live_server import free_port

GAUGES = [
    names.OPERATOR_DESIRED_REPLICAS,
    names.OPERATOR_CURRENT_REPLICAS,
    names.OPERATOR_READY_REPLICAS,
    names.OPERATOR_MAX_REPLICAS,
    names.OPERATOR_QUEUE_DEPTH,
    names.OPERATOR_P95_SECONDS,
    names.OPERATOR_ARRIVALS,
    names.OPERATOR_REPLICA_CAPACITY,
]
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 2,
    # A target is required (a CEL rule); the stand-in these tests used before let it be left out.
    "autoscaling": {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 3,
        "intervalSeconds": 1,
        "targetQueueDepth": 4,
    },
}
READY_POD = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _md(name: str, spec: dict = SPEC) -> dict:
    return crd.defaulted({"metadata": {"name": name, "namespace": "ns"}, "spec": spec})


def _value(metric: str, name: str, namespace: str = "ns") -> float | None:
    return REGISTRY.get_sample_value(metric, {"namespace": namespace, "name": name})


# -- in-process ----------------------------------------------------------------------------------


# Two pods, one ready (no podIP: its scrape fails at once).
PODS = [
    {"metadata": {"name": "p-0"}, "status": READY_POD},
    {"metadata": {"name": "p-1"}, "status": {"phase": "Pending"}},
]


class _Stopped:
    """kopf's DaemonStopped as the daemon uses it: truthy once set, wait(timeout)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)


def test_step_sets_max(monkeypatch):
    monkeypatch.setattr(autoscaler, "write", lambda *args, **kwargs: None)

    async def one_step():
        async with httpx.AsyncClient() as client:
            return await autoscaler.step(_md("stepped"), Window(60), client, PODS)

    asyncio.run(one_step())
    assert _value(names.OPERATOR_MAX_REPLICAS, "stepped") == 3
    # desired, current and ready: the status refresh's, for every ModelDeployment
    assert _value(names.OPERATOR_DESIRED_REPLICAS, "stepped") is None


def _every_gauge(name: str) -> None:
    for gauge in metrics.GAUGES:
        gauge.labels("ns", name).set(1)


def test_forget_drops_every_gauge_of_one_modeldeployment_only():
    _every_gauge("gone")
    _every_gauge("kept")
    metrics.forget("ns", "gone")
    metrics.forget("ns", "never-seen")  # nothing to drop: no error
    assert [_value(g, "gone") for g in GAUGES] == [None] * len(GAUGES)
    assert [_value(g, "kept") for g in GAUGES] == [1.0] * len(GAUGES)
    assert {g._name for g in metrics.GAUGES} == set(GAUGES)  # GAUGES names every gauge


def _run_daemon(name: str) -> tuple[_Stopped, asyncio.Task]:
    stopped = _Stopped()
    body = _md(name)
    task = asyncio.ensure_future(
        autoscaler.autoscale(body=body, stopped=stopped, name=name, namespace="ns", owned_pods={})
    )
    return stopped, task


def test_the_daemon_drops_the_gauges_when_stopped(monkeypatch):
    async def step(md, window, client, pods):
        _every_gauge(md["metadata"]["name"])

    monkeypatch.setattr(autoscaler, "step", step)

    async def scenario():
        stopped, task = _run_daemon("stopped")
        await asyncio.sleep(0.05)
        assert _value(names.OPERATOR_MAX_REPLICAS, "stopped") == 1
        stopped.event.set()  # kopf: deleted, or autoscaling turned off
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert [_value(g, "stopped") for g in GAUGES] == [1.0, 1.0, 1.0] + [None] * 5


def test_the_status_daemon_drops_its_gauges_when_stopped(monkeypatch):
    """kopf stops it when the ModelDeployment goes, and when peering pauses this replica while
    another one reports the same ModelDeployment."""
    monkeypatch.setattr(
        handlers, "report", lambda body, *_: metrics.set_replicas("ns", "paused", 2, 2, 1) or {}
    )

    async def scenario():
        stopped = _Stopped()
        kwargs = {"name": "paused", "namespace": "ns", "owned_deployments": {}, "owned_pods": {}}
        task = asyncio.ensure_future(
            handlers.keep_status(body=_md("paused"), stopped=stopped, **kwargs)
        )
        await asyncio.sleep(0.05)
        assert _value(names.OPERATOR_READY_REPLICAS, "paused") == 1
        stopped.event.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert [_value(g, "paused") for g in GAUGES[:3]] == [None, None, None]


def test_a_failed_step_keeps_the_gauges_for_kopfs_retry(monkeypatch):
    async def step(md, window, client, pods):
        _every_gauge(md["metadata"]["name"])
        raise RuntimeError("the API server went away")

    monkeypatch.setattr(autoscaler, "step", step)

    async def scenario():
        _, task = _run_daemon("failing")
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert [_value(g, "failing") for g in GAUGES] == [1.0] * len(GAUGES)


# -- the real operator ---------------------------------------------------------------------------


@pytest.fixture
def operator(kube_namespace, tmp_path):
    """(the cluster, a function returning the operator's gauges now); the node runs."""
    cluster, node = kube_namespace, Node(kube_namespace)
    log, port = tmp_path / "operator.log", free_port()
    cluster.start_operator(log, metrics_port=port)

    def gauges() -> dict[tuple[str, str], dict[str, float]]:
        """(metric, ModelDeployment name) -> value, for the operator's gauges."""
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return {}
        return {
            (s.name, s.labels["name"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name in GAUGES
        }

    try:
        cluster.wait_for_operator()
        wait_for("the operator's /metrics", lambda: httpx.get(f"http://127.0.0.1:{port}/metrics"))
        node.start()
        yield cluster, gauges
        cluster.delete_model_deployments()
    finally:
        node.stop()
        cluster.stop_operator()
        print(log.read_text()[-3000:])  # shown by pytest when the test fails


def _series_of(gauges: dict, name: str) -> dict[str, float]:
    return {metric: value for (metric, md), value in gauges.items() if md == name}


def test_operator_exports_max_and_drops_gauges_on_autoscaling_off_and_delete(operator):
    cluster, gauges = operator
    cluster.create(MD, {"metadata": {"name": "auto"}, "spec": SPEC})
    fixed = {k: v for k, v in SPEC.items() if k != "autoscaling"}
    cluster.create(MD, {"metadata": {"name": "fixed"}, "spec": fixed})
    wait_for("the Deployments", lambda: len(cluster.list(DEPLOYMENTS)) == 2)

    def counted() -> dict[str, float]:
        series = _series_of(gauges(), "auto")
        replicas = [names.OPERATOR_CURRENT_REPLICAS, names.OPERATOR_READY_REPLICAS]
        return series if [series.get(r) for r in replicas] == [2, 2] else {}

    series = wait_for("the autoscaler to count both pods", counted)
    assert series[names.OPERATOR_MAX_REPLICAS] == 3
    assert 1 <= series[names.OPERATOR_DESIRED_REPLICAS] <= 3
    # No autoscaling, no bound to be pinned at.
    assert names.OPERATOR_MAX_REPLICAS not in _series_of(gauges(), "fixed")

    # A new bound shows on the next decision.
    cluster.patch(MD, "auto", {"spec": {"autoscaling": {"maxReplicas": 5}}})
    wait_for("max 5", lambda: _series_of(gauges(), "auto").get(names.OPERATOR_MAX_REPLICAS) == 5)

    # Autoscaling off: the autoscaler's series go, the replica counts stay.
    cluster.patch(MD, "auto", {"spec": {"autoscaling": {"enabled": False}}})
    wait_for(
        "max to go with autoscaling",
        lambda: names.OPERATOR_MAX_REPLICAS not in _series_of(gauges(), "auto"),
    )
    assert names.OPERATOR_READY_REPLICAS in _series_of(gauges(), "auto")

    cluster.patch(MD, "auto", {"spec": {"autoscaling": {"enabled": True}}})
    wait_for("max back", lambda: names.OPERATOR_MAX_REPLICAS in _series_of(gauges(), "auto"))

    # Deleted: every series of it goes, without an operator restart.
    cluster.delete(MD, "auto")
    wait_for("the ModelDeployment to go", lambda: cluster.get(MD, "auto") is None)
    time.sleep(1.5)  # more than the autoscaler's interval: nothing sets them again
    assert _series_of(gauges(), "auto") == {}


def test_replica_gauges_for_a_modeldeployment_without_autoscaling(operator):
    cluster, gauges = operator
    fixed = {k: v for k, v in SPEC.items() if k != "autoscaling"}
    cluster.create(MD, {"metadata": {"name": "fixed"}, "spec": fixed})
    wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, "fixed"))
    replicas = [
        names.OPERATOR_DESIRED_REPLICAS,
        names.OPERATOR_CURRENT_REPLICAS,
        names.OPERATOR_READY_REPLICAS,
    ]
    wait_for(
        "desired, current and ready 2",
        lambda: [_series_of(gauges(), "fixed").get(r) for r in replicas] == [2, 2, 2],
        timeout=5,
    )
    assert names.OPERATOR_MAX_REPLICAS not in _series_of(gauges(), "fixed")
    cluster.delete(MD, "fixed")
    wait_for("the ModelDeployment to go", lambda: cluster.get(MD, "fixed") is None)
    wait_for("its gauges to go", lambda: not _series_of(gauges(), "fixed"), timeout=5)
