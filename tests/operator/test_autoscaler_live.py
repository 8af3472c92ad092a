"""The autoscaler end to end on loopback: the real operator against the real control plane (the
real Deployment controller makes and removes the pods), a real `kvpilot serve` (tiny model, at
most 2 sequences at a time) behind every Pod on its own 127.0.0.x address, and real load. A
load step raises the replicas, with an Event and the reason in status; when the load stops
they go back to minReplicas after the (shortened) stabilization."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvpilot_testing.kube.cluster import EVENTS, MD, wait_for
from kvpilot_testing.kube.node import PORT, Node, serve_tiny

BODY = {
    "model": "tiny",
    "prompt": "The river",
    "max_tokens": 48,
    "ignore_eos": True,
    "temperature": 0,
}
SPEC = {
    # The name the load sends: the test's kubelet serves what the pod's args ask for.
    "model": {"source": "builtin://smollm2-135m-instruct", "servedModelName": "tiny"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 1,
    "autoscaling": {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetQueueDepth": 2,
        "windowSeconds": 10,
        "intervalSeconds": 2,
        "scaleDown": {"stabilizationSeconds": 10, "maxStepReplicas": 2},
    },
}


@pytest.fixture
def live(cluster, tiny_dir):
    """The namespace the session's operator watches, and this test's node."""
    node = Node(cluster, *serve_tiny(tiny_dir("llama"), "--max-num-seqs", "2"))
    node.start(interval=0.2)
    try:
        yield cluster, node
        cluster.delete_model_deployments()  # while the node still finishes deleting pods
    finally:
        node.stop()
        print("node errors:", node.errors[-5:])


def _load(node: Node, stop: threading.Event, deadline: float) -> int:
    """Closed-loop clients, 12 at a time, spread over the pods; bounded in time."""
    sent = 0

    def client(i: int) -> int:
        done = 0
        with httpx.Client(timeout=60) as http:
            while not stop.is_set() and time.monotonic() < deadline:
                addresses = node.addresses()
                if not addresses:
                    time.sleep(0.2)
                    continue
                address = addresses[(i + done) % len(addresses)]
                try:
                    http.post(f"http://{address}:{PORT}/v1/completions", json=BODY)
                    done += 1
                except httpx.HTTPError:
                    time.sleep(0.1)  # a pod that just went away
        return done

    with ThreadPoolExecutor(12) as pool:
        sent = sum(pool.map(client, range(12)))
    return sent


def test_load_step_scales_up_with_reasons_and_idle_scales_back(live):
    cluster, node = live
    cluster.create(MD, {"metadata": {"name": "auto"}, "spec": SPEC})
    wait_for("the first pod to serve", lambda: node.addresses(), timeout=120)

    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(node, stop, time.monotonic() + 240))
    loader.start()
    try:
        scaled = wait_for(
            "a scale-up",
            lambda: (cluster.get(MD, "auto") or {}).get("spec", {}).get("replicas", 1) > 1,
            timeout=120,
        )
        assert scaled

        # One read: the step that scaled wrote its decision and what it observed together;
        # a second read could find a later step's record instead, whose scrape of a pod just
        # started (or starved of CPU) failed and observed nothing.
        def decided() -> dict | None:
            autoscaling = cluster.get(MD, "auto")["status"].get("autoscaling") or {}
            return autoscaling if autoscaling.get("decisions") else None

        autoscaling = wait_for("a decision in status", decided, timeout=30)
        decision = autoscaling["decisions"][0]
        assert "queue" in decision["reason"] and decision["to"] > decision["from"]
        # What sizing from demand needs is measured and kept: the arrivals the pods saw, and
        # how long this model's pods took from start to Ready (this node starts them at once).
        assert autoscaling["observed"]["arrivalsPerSecond"] > 0
        assert autoscaling["startupSeconds"] is not None and autoscaling["startupSeconds"] >= 0
        assert autoscaling["arrivals"]  # the trend's samples, for the next step (or operator)
        events = wait_for(
            "a ScaledUp Event",
            lambda: [e for e in cluster.list(EVENTS) if e["reason"] == "ScaledUp"],
            timeout=30,
        )
        assert "queue" in events[0]["message"] and "->" in events[0]["message"]
    finally:
        stop.set()
        loader.join(120)

    def back_to_min() -> bool:
        # The autoscaler patches the scale subresource first and status.autoscaling just
        # after (status records what was done), so the two land in separate writes.
        md = cluster.get(MD, "auto")
        decisions = md.get("status", {}).get("autoscaling", {}).get("decisions") or [{}]
        return md["spec"]["replicas"] == 1 and decisions[-1].get("to") == 1

    wait_for("back to minReplicas, the decision in status", back_to_min, timeout=120)
    # kopf posts Events from its own queue, after the call that made them returned.
    wait_for(
        "a ScaledDown Event",
        lambda: any(e["reason"] == "ScaledDown" for e in cluster.list(EVENTS)),
        timeout=30,
    )
