"""permissions.GATEWAY against what the gateway really does: the real `kvpilot gateway` under a
token of the chart's ServiceAccount for it (the session's release, watch.scope=All: the gateway's
ClusterRole), through a life that makes each kind of call (its watches, and a request held for a
model at zero, which it reports with its annotation), every request it made read back from the
API server's audit log. None refused, every call declared, every declaration used."""

import os
import subprocess
import sys
from datetime import UTC, datetime

import httpx

from kvpilot_common import demand
from kvpilot_operator import permissions
from kvpilot_testing.kube.cluster import MD, wait_for
from kvpilot_testing.live_server import free_port, terminate
from tests.chart.live import calls, forbidden, is_public, non_resource

# Scaled to zero and wakeable: a request is held (no operator runs here, so it stays held).
ASLEEP = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 0,
    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "targetQueueDepth": 4},
}
CHAT = {"model": "asleep", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_every_gateway_call_is_declared_and_every_declaration_used(kube, kube_namespace, tmp_path):
    assert kube.gateway_kubeconfig is not None and kube.gateway_user is not None
    cluster = kube_namespace
    cluster.create(MD, {"metadata": {"name": "asleep"}, "spec": ASLEEP})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "kvpilot_common.cli", "gateway", "--port", str(port)]
    argv += ["--namespace", cluster.ns, "--hold-timeout", "3"]
    env = {"KUBECONFIG": str(kube.gateway_kubeconfig), "POD_NAME": "audited-gateway"}
    log = tmp_path / "gateway.log"
    started = datetime.now(UTC)
    with log.open("ab") as out:
        gateway = subprocess.Popen(
            argv, env={**_inherited(), **env}, stdout=out, stderr=subprocess.STDOUT
        )

    def ready() -> bool:
        assert gateway.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("the gateway to be ready", ready, timeout=60, interval=0.2)
        # Held (the annotation is written at once), then 503 once the hold time has passed.
        answer = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30)
        assert answer.status_code == 503 and "Retry-After" in answer.headers, answer.text
        annotations = cluster.get(MD, "asleep")["metadata"].get("annotations") or {}
        assert demand.annotation_key("audited-gateway") in annotations
    finally:
        terminate(gateway, grace=20)
        print(log.read_text()[-3000:])  # shown when the test fails
    stopped = datetime.now(UTC)
    events = [
        e
        for e in kube.plane.audit(kube.gateway_user)
        if started <= datetime.fromisoformat(e["requestReceivedTimestamp"]) <= stopped
    ]
    assert events, "the audit log has not seen the gateway"
    assert forbidden(events) == []
    assert {path for path in non_resource(events) if not is_public(path)} == set()
    made = {(c.api_group, c.resource, c.verb) for e in events for c in calls(e)}
    declared = {(p.api_group, p.resource, v) for p in permissions.GATEWAY for v in p.verbs}
    assert made == declared
    # It stays in the namespaces it was told to watch.
    assert {c.namespace for e in events for c in calls(e)} == {cluster.ns}


def _inherited() -> dict[str, str]:
    """PATH and PYTHONPATH (the code under test); nothing else of the test's environment, as a
    container gets none of it."""
    return {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
