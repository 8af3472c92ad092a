"""What a real kubelet, containerd and scheduler do with pods, which the played node
(kube/node.py) can only imitate: an image run as uid 1000 on a read-only root, turned Ready by
an exec probe; a memory limit that is a real OOM kill; an image that is not on the node; the
scheduler's own words for a GPU request no node can meet; SIGTERM on delete. Last, the node is
stopped and the host's network state compared with what it was before it started."""

import json
import subprocess
import sys
import time

from kvpilot_testing.kube.controlplane import ADMIN_TOKEN
from kvpilot_testing.kube.hoststate import host_state
from kvpilot_testing.kube.images import WORKLOAD_IMAGE
from kvpilot_testing.kube.realnode import NAMESPACE, NODE_NAME, POD_CIDR

PODS = "/api/v1/namespaces/default/pods"


def _pod(name: str, image: str = WORKLOAD_IMAGE, args: list[str] = (), **container) -> dict:
    spec = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",  # nothing is ever pulled here
        "args": list(args),
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        **container,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [spec], "terminationGracePeriodSeconds": 10},
    }


def _create(real_node, body: dict) -> None:
    with real_node.plane.client() as http:
        http.post(PODS, json=body).raise_for_status()


def _pod_status(real_node, name: str) -> dict:
    return (real_node.plane.get(f"{PODS}/{name}") or {}).get("status", {})


def _wait(real_node, what: str, check, timeout: float = 60):
    return real_node.plane.wait_for(what, check, timeout)


def _container(real_node, name: str) -> dict:
    statuses = _pod_status(real_node, name).get("containerStatuses") or [{}]
    return statuses[0]


def _condition(real_node, name: str, kind: str) -> dict:
    conditions = _pod_status(real_node, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def _is_true(real_node, name: str, kind: str) -> bool:
    return _condition(real_node, name, kind).get("status") == "True"


def _state(real_node, name: str) -> dict:
    return _container(real_node, name).get("state", {})


def test_a_pod_runs_as_uid_1000_read_only_and_turns_ready_by_its_exec_probe(real_node):
    probe = {"exec": {"command": ["/workload", "true"]}, "periodSeconds": 1}
    _create(real_node, _pod("ready", readinessProbe=probe))
    _wait(real_node, "Ready", lambda: _is_true(real_node, "ready", "Ready"))
    status = _pod_status(real_node, "ready")
    assert status["phase"] == "Running"
    prefix = POD_CIDR.rsplit(".", 1)[0] + "."
    assert status["podIP"].startswith(prefix)  # from the bridge plugin's range
    pod = real_node.plane.get(f"{PODS}/ready")
    assert pod["spec"]["nodeName"] == NODE_NAME  # bound by the real scheduler
    assert _container(real_node, "ready")["started"] is True


def test_a_memory_limit_below_use_is_a_real_oom_kill(real_node):
    limits = {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}}
    _create(real_node, _pod("hog", args=["hog", "128"], resources=limits))

    def killed() -> dict | None:
        container = _container(real_node, "hog")
        return container.get("lastState", {}).get("terminated") or _state(real_node, "hog").get(
            "terminated"
        )

    terminated = _wait(real_node, "the OOM kill", killed, 90)
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


def test_an_image_not_on_the_node_is_err_image_never_pull(real_node):
    _create(real_node, _pod("absent", image="kvpilot.test/absent:1"))

    def waiting() -> dict | None:
        state = _state(real_node, "absent").get("waiting") or {}
        return state if state.get("reason") == "ErrImageNeverPull" else None

    state = _wait(real_node, "ErrImageNeverPull", waiting)
    assert "kvpilot.test/absent:1" in state["message"]


def test_the_scheduler_says_why_no_node_has_the_gpus(real_node):
    # Extended resources are advertised by patching the node's status capacity.
    patch = {"status": {"capacity": {"nvidia.com/gpu": "2"}}}
    with real_node.plane.client() as http:
        http.patch(
            f"/api/v1/nodes/{NODE_NAME}/status",
            json=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
    gpus = {"limits": {"nvidia.com/gpu": "4"}}
    _create(real_node, _pod("gpus", resources=gpus))

    def unschedulable() -> dict | None:
        condition = _condition(real_node, "gpus", "PodScheduled")
        return condition if condition.get("reason") == "Unschedulable" else None

    condition = _wait(real_node, "the scheduler's verdict", unschedulable)
    assert condition["message"].startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu")


def test_deleting_a_pod_sends_sigterm_and_the_kubelet_reports_its_exit(real_node):
    """The workload exits 0 on SIGTERM: the kubelet's last word on the container, seen on a
    watch before the pod goes, is that exit, well within the 30 s grace period (a process that
    ignored SIGTERM would be killed at its end, 137)."""
    body = _pod("graceful")
    body["spec"]["terminationGracePeriodSeconds"] = 30
    _create(real_node, body)
    _wait(real_node, "running", lambda: _state(real_node, "graceful").get("running"))
    version = real_node.plane.get(f"{PODS}/graceful")["metadata"]["resourceVersion"]
    query = f"watch=1&fieldSelector=metadata.name=graceful&resourceVersion={version}"
    last: dict = {}
    started = time.monotonic()
    with real_node.plane.client() as http:
        http.delete(f"{PODS}/graceful").raise_for_status()
        with http.stream("GET", f"{PODS}?{query}", timeout=40) as events:
            for line in events.iter_lines():
                event = json.loads(line)
                if event["type"] == "DELETED":
                    break
                statuses = event["object"]["status"].get("containerStatuses") or [{}]
                last = statuses[0].get("state", {}).get("terminated") or last
    assert time.monotonic() - started < 15
    assert (last.get("exitCode"), last.get("reason")) == (0, "Completed")


def test_the_api_servers_service_address_leads_to_it_through_kube_proxy(real_node):
    """From the node's network namespace, as a pod's in-cluster client dials it: the
    `kubernetes` Service's cluster IP, which only kube-proxy's rules carry to the API server."""
    service = real_node.plane.get("/api/v1/namespaces/default/services/kubernetes")
    address = f"https://{service['spec']['clusterIP']}:443/readyz"
    headers = f"{{'Authorization': 'Bearer {ADMIN_TOKEN}'}}"
    script = f"import httpx; print(httpx.get({address!r}, verify=False, headers={headers}).text)"
    argv = ["nsenter", f"--net=/run/netns/{NAMESPACE}", "--", sys.executable, "-c", script]

    def answered() -> subprocess.CompletedProcess | None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        return done if done.stdout.strip() == "ok" else None

    # kube-proxy writes its rules once it has seen the Service: give it a few seconds.
    _wait(real_node, "an answer through the Service's cluster IP", answered, 30)


def test_the_host_is_as_it_was(real_node):
    """Last of the session (conftest.py orders it): stops the node, its control plane and their
    network (the fixture's stop is then a no-op) and compares the host's links, addresses,
    routes, packet filter rules, the sysctls and the few files written outside the node's
    folders with their state before the session's node began."""
    real_node.stop()
    after = host_state()
    for key, before in real_node.host_before.items():
        assert after[key] == before, key
