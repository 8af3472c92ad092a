"""Two real operators with kopf's peering, run as the chart runs them with operator.replicas=2
(its command, args and env, the pod name played for POD_ID, under the chart's ServiceAccount and
RBAC, with the chart's kopf.dev CRDs) on a control plane of their own: both keep themselves
alive in the peering object, only the older one acts (it reconciles and reports status; the
other has not one series about the ModelDeployment and has not resumed); the active one killed
by PID (SIGKILL: no clean exit), the other resumes within the peering lifetime and takes the
ModelDeployment over. No call is refused, and kopf's
peering calls are the ones permissions.PEERING declares.

Then one frozen past its keep-alive and thawed: two replicas act for a while, and neither
loses the other's autoscaling decision.
"""

import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_operator import permissions
from kvpilot_testing.kube.cluster import DEPLOYMENTS, MD, Cluster, wait_for
from kvpilot_testing.kube.install import NAMESPACE, Installed
from kvpilot_testing.kube.node import PORT, Node
from tests.chart.live import OPERATOR, ChartOperator, calls, forbidden, operator_events

LIFETIME = 5  # seconds; the chart's least (kopf then renews the keep-alive every second)
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
}


@pytest.fixture(scope="module")
def release(chart_plane) -> Iterator[Installed]:
    values = ["--set", "operator.replicas=2"]
    values += ["--set", f"operator.peeringLifetimeSeconds={LIFETIME}"]
    with chart_plane.release(*values) as installed:
        yield installed


def _series(operator: ChartOperator, name: str) -> set[str]:
    """The operator's own metrics about ModelDeployment `name`: what it reconciled, reported."""
    try:
        url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
        text = httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return set()
    return {
        s.name
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("name") == name
    }


def _logged(operator: ChartOperator, text: str) -> bool:
    return text in operator.log_path.read_text(errors="replace")


def _peers(cluster: Cluster, count: int) -> dict[str, dict] | None:
    """The replicas' keep-alives in the peering object (by pod name), once there are `count`."""
    peers = _keep_alives(cluster)
    return peers if len(peers) == count else None


def _keep_alives(cluster: Cluster) -> dict[str, dict]:
    path = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings/{OPERATOR}"
    response = cluster.http.get(path)
    return (response.json().get("status") or {}) if response.status_code == 200 else {}


def _conditions(cluster: Cluster, name: str) -> dict[str, str]:
    status = (cluster.get(MD, name) or {}).get("status") or {}
    return {c["type"]: c["reason"] for c in status.get("conditions", [])}


def test_one_of_two_operators_acts_and_the_other_takes_over_when_killed(release, tmp_path):
    cluster = Cluster(release.plane, NAMESPACE, release.operator_kubeconfig)
    first = ChartOperator(release, tmp_path / "first.log", pod=f"{OPERATOR}-first")
    second = ChartOperator(release, tmp_path / "second.log", pod=f"{OPERATOR}-second")
    reported = names.OPERATOR_READY_REPLICAS  # set by every status refresh (handlers.report)
    try:
        first.start()
        second.start()  # the younger: it waits
        assert f"--peering={OPERATOR}" in first.argv
        peers = wait_for("both in the peering object", lambda: _peers(cluster, 2))
        assert peers[first.pod]["priority"] > peers[second.pod]["priority"]
        assert peers[first.pod]["lifetime"] == LIFETIME

        cluster.create(MD, {"metadata": {"name": "elected"}, "spec": SPEC})
        wait_for("the Deployment", lambda: cluster.get(DEPLOYMENTS, "elected"))
        wait_for("status", lambda: _conditions(cluster, "elected").get("Degraded"))
        wait_for("the first's status gauges", lambda: reported in _series(first, "elected"))
        assert names.OPERATOR_RECONCILE_SECONDS + "_count" in _series(first, "elected")
        time.sleep(1)  # a second more for the paused one to do what it should not
        assert _series(second, "elected") == set()
        # Paused from its start (kopf logs only a change): it has not resumed.
        assert not _logged(second, "Resuming operations")

        killed = time.monotonic()
        first.kill()
        wait_for(
            "the second to take over",
            lambda: reported in _series(second, "elected"),
            timeout=LIFETIME + 10,
        )
        took = time.monotonic() - killed
        assert took < LIFETIME + 5, took
        assert _logged(second, "Resuming operations after the pause")

        # It acts now: a spec change reaches the Deployment.
        cluster.patch(MD, "elected", {"spec": {"engine": {"maxNumSeqs": 4}}})

        def rolled() -> bool:
            pod = cluster.get(DEPLOYMENTS, "elected")["spec"]["template"]["spec"]
            return "--max-num-seqs=4" in pod["containers"][0]["args"]

        wait_for("the second to reconcile", rolled)
        cluster.delete_model_deployments()  # kopf's finalizer: the second removes it
        print(f"taken over {took:.1f} s after SIGKILL (peering lifetime {LIFETIME} s)")
    finally:
        first.stop()
        second.stop()
        cluster.close()
        print(first.log_tail(), second.log_tail())  # shown when the test fails

    events = operator_events(release)
    assert forbidden(events) == []
    made = [c for e in events for c in calls(e) if c.api_group == "kopf.dev"]
    peering = {(c.resource, c.verb, c.namespace) for c in made}
    (declared,) = permissions.PEERING
    assert peering == {(declared.resource, verb, NAMESPACE) for verb in declared.verbs}


class Silent:
    """A model pod's server that takes connections and never answers (a hung replica): every
    autoscaler scrape of it waits out the scrape timeout. `scrapes`: when each one came."""

    def __init__(self, address: str) -> None:
        self.listener = socket.create_server((address, PORT))
        self.listener.settimeout(0.1)
        self.held: list[socket.socket] = []
        self.scrapes: list[float] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.held.append(connection)
            self.scrapes.append(time.monotonic())

    def close(self) -> None:
        self.closed.set()
        self.thread.join(5)
        for connection in [*self.held, self.listener]:
            connection.close()


def _scales(release: Installed, name: str) -> list[dict]:
    """The operators' scale subresource patches of `name` that the API server carried out."""
    return [
        e
        for e in operator_events(release)
        if e["verb"] == "patch"
        and (e.get("objectRef") or {}).get("subresource") == "scale"
        and e["objectRef"].get("name") == name
        and e.get("responseStatus", {}).get("code") == 200
    ]


def test_a_replica_frozen_past_its_keep_alive_loses_no_autoscaling_decision(release, tmp_path):
    """The acting replica freezes mid autoscaler step (SIGSTOP: a throttled or paused
    container) past the peering lifetime, so the other takes over and scales; thawed, it is
    still the older one, acts on, and finishes its step from what it read before the freeze.
    kopf's peering has no fencing: only writes conditional on what was read keep the other's
    decision. Every scale the API server carried out is recorded in status.autoscaling."""
    cluster = Cluster(release.plane, NAMESPACE, release.operator_kubeconfig)
    servers: list[Silent] = []  # the model's pods' (the chart's own pods get none)

    def serve(address: str, pod: dict) -> Silent | None:
        if not pod["metadata"]["name"].startswith("frozen-"):
            return None
        servers.append(Silent(address))
        return servers[-1]

    node = Node(cluster, serve, lambda server: server and server.close())
    old = ChartOperator(release, tmp_path / "old.log", pod=f"{OPERATOR}-old")
    new = ChartOperator(release, tmp_path / "new.log", pod=f"{OPERATOR}-new")
    autoscaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 1}
    spec = {**SPEC, "replicas": 1, "autoscaling": {**autoscaling, "targetQueueDepth": 4}}
    try:
        node.start(interval=0.1)
        old.start()
        new.start()
        wait_for("both alive", lambda: {old.pod, new.pod} <= set(_keep_alives(cluster)))
        cluster.create(MD, {"metadata": {"name": "frozen"}, "spec": spec})
        wait_for("the old one's autoscaler", lambda: servers and servers[0].scrapes, timeout=60)
        seen = len(servers[0].scrapes)
        wait_for("its next step", lambda: len(servers[0].scrapes) > seen)
        assert old.process is not None
        old.process.send_signal(signal.SIGSTOP)  # read, scraping: its write is still to come
        # minReplicas above the replicas: the next step scales up, metrics or not.
        cluster.patch(MD, "frozen", {"spec": {"autoscaling": {"minReplicas": 3}}})
        wait_for("the new one to scale", lambda: _decisions(cluster), timeout=LIFETIME + 15)
        old.process.send_signal(signal.SIGCONT)
        wait_for("the new one to pause", lambda: _logged(new, "Pausing operations"), timeout=15)
        time.sleep(3)  # the old one's steps: its frozen one, and one from what it reads now
        md = cluster.get(MD, "frozen")
        scales = _scales(release, "frozen")
        assert len(scales) == 1, [s["requestReceivedTimestamp"] for s in scales]
        assert [(d["from"], d["to"]) for d in _decisions(cluster)] == [(1, 3)], md["status"]
        assert md["spec"]["replicas"] == 3
        refused = [e for e in operator_events(release) if _conflict(e)]
        print(f"{len(refused)} writes of the ModelDeployment refused with 409")
        cluster.delete_model_deployments()
    finally:
        if old.process is not None:
            old.process.send_signal(signal.SIGCONT)
        old.stop()
        new.stop()
        node.stop()
        cluster.close()
        print(old.log_tail(), new.log_tail())


def _conflict(event: dict) -> bool:
    ref = event.get("objectRef") or {}
    code = event.get("responseStatus", {}).get("code")
    return ref.get("name") == "frozen" and ref.get("resource") == "modeldeployments" and code == 409


def _decisions(cluster: Cluster) -> list[dict]:
    md = cluster.get(MD, "frozen") or {}
    return ((md.get("status") or {}).get("autoscaling") or {}).get("decisions") or []
