"""Models served by kvpilot's own server image under a real kubelet: the chart installed with
the operator and server-cpu images built from the Dockerfile, `builtin-cpu.yaml` applied as
shipped but for its CPUs, and the pods the operator makes started by the kubelet (uid 1000,
read-only root, the operator's probes, the kernels prebuilt in the image). Then what a model
owner does to it: a chat completion through the model's Service and through the gateway's (as a
client pod in the cluster sends them), `kubectl scale` to 2 and a pod killed without a drain while
it streams through the gateway (the gateway, sharing its secret with the model pods through the
chart and the operator, goes on from the other replica), back to 1, a pod deleted while it
streams (the stream drains to its end), the ModelDeployment deleted (its children go), a
model at zero replicas woken by a request held in the gateway's pod, the autoscaler under load,
and LoRA adapters on a PersistentVolumeClaim served through the gateway, one more added to the
spec reaching the running pod without a restart."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_common.naming import INSTANCE_LABEL
from kvpilot_server.models.builtin import builtin_path
from kvpilot_testing.kube.cluster import (
    DEPLOYMENTS,
    EVENTS,
    MD,
    PODS,
    SERVICES,
    Cluster,
    wait_for,
)
from kvpilot_testing.kube.install import NAMESPACE, RELEASE
from kvpilot_testing.kube.realnode import NAMESPACE as NETNS
from kvpilot_testing.lora import AdapterSpec, build_adapter
from kvpilot_testing.paths import ROOT

QUESTION = {"role": "user", "content": "What is the capital of France?"}
CLIENT = Path(__file__).parent / "in_the_cluster.py"
# The node has 2 cores: two model replicas beside the operator (100m) and the gateway (2 x 200m).
CPU = "700m"
TOKENS = 200  # streamed by the pod deleted mid-stream
RESUMED_TOKENS = 80  # streamed through the gateway by the pod killed mid-stream
# Its drain timeout: only a bound (a pod that has drained exits then, and no test waits out a
# grace period), with room for those tokens at a loaded machine's pace: 120 s was measured too
# short with other test suites running beside this one (about 1 token a second).
DRAIN_S = 300
# Short chats at a rate one replica at 0.7 of a core serves, but not within 100 ms to the first
# token: the autoscaler's reason to add the second.
LOAD = {
    "name": "scale-up",
    "duration_s": 40,
    "timeout_s": 300,
    "arrival": {"process": "poisson", "rate": 1},
    "classes": [
        {
            "name": "chat",
            "share": 1,
            "api": "chat",
            "stream": True,
            "prompt_tokens": {"dist": "uniform", "min": 32, "max": 96},
            "output_tokens": {"dist": "uniform", "min": 8, "max": 24},
        }
    ],
}


@pytest.fixture(scope="module")
def adapters(chart: Cluster, tmp_path_factory) -> Path:
    """Three LoRA adapters of the bundled model in a folder of this machine (the node) and the
    claim `adapters` on it, made before the image is waited for: the controller manager binds
    the two meanwhile (its binder may take a resync of 15 s), not during the LoRA test."""
    folder = tmp_path_factory.mktemp("adapters")
    base = builtin_path("smollm2-135m-instruct")
    for i, name in enumerate(("formal", "terse", "pirate")):
        build_adapter(
            base, folder / name, AdapterSpec(rank=4, targets=("q_proj", "v_proj"), seed=i)
        )
    for path in [folder, *folder.rglob("*")]:  # the pod runs as uid 1000
        path.chmod(0o755 if path.is_dir() else 0o644)
    folder.parent.chmod(0o755)
    _claim_of_adapters(chart, folder)
    return folder


@pytest.fixture(scope="module")
def cluster(chart: Cluster, server_cpu, adapters) -> Cluster:
    """The session's chart (conftest.py), once the server-cpu image, which it names as the
    models' image, is in the node."""
    server_cpu.wait(timeout=600)
    return chart


def _client(*args: str, timeout: float = 360) -> subprocess.Popen:
    """in_the_cluster.py in the node's network namespace; its JSON lines on stdout."""
    argv = ["nsenter", f"--net=/run/netns/{NETNS}", "--", sys.executable, str(CLIENT), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _post(url: str, body: dict, command: str = "post") -> dict:
    client = _client(command, url, json.dumps(body))
    out, err = client.communicate(timeout=360)
    assert client.returncode == 0, err[-2000:]
    return json.loads(out)


def _service_url(cluster: Cluster, namespace: str, name: str) -> str:
    service = cluster.plane.get(f"/api/v1/namespaces/{namespace}/services/{name}")
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def _gateway(cluster: Cluster) -> str:
    return _service_url(cluster, NAMESPACE, f"{RELEASE}-gateway")


def _pods(cluster: Cluster, model: str) -> list[dict]:
    with cluster.plane.client() as http:
        params = {"labelSelector": f"{INSTANCE_LABEL}={model}"}
        return http.get(cluster.path(PODS), params=params).json().get("items", [])


def _log(cluster: Cluster, pod: dict) -> str:
    """A pod's log, through the API server from the kubelet."""
    with cluster.plane.client() as http:
        return http.get(cluster.path(PODS, pod["metadata"]["name"]) + "/log").text


def _status(cluster: Cluster, name: str) -> dict:
    status = (cluster.get(MD, name) or {}).get("status", {})
    found = {c["type"]: c for c in status.get("conditions", [])}
    if found.get("Degraded", {}).get("status") == "True":
        raise AssertionError(f"Degraded: {found['Degraded']}")
    return status


def _ready_replicas(cluster: Cluster, name: str, count: int) -> bool:
    """The model's status and its pods agree that exactly `count` replicas serve."""
    status, pods = _status(cluster, name), _pods(cluster, name)
    leaving = [p for p in pods if p["metadata"].get("deletionTimestamp")]
    return status.get("readyReplicas") == count == len(pods) and not leaving


def _wait_replicas(cluster: Cluster, name: str, count: int, timeout: float, what: str) -> None:
    wait_for(what, lambda: _ready_replicas(cluster, name, count), timeout=timeout, interval=1)


def _kubectl(cluster: Cluster, *args: str) -> str:
    argv = [cluster.plane.bin / "kubectl", "--kubeconfig", cluster.plane.kubeconfig, "-n", "models"]
    done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cpu_sample_turns_ready_and_answers_through_its_service_and_the_gateway(
    cluster, tmp_path
):
    body = yaml.safe_load((ROOT / "crds/samples/builtin-cpu.yaml").read_text())
    body["spec"]["resources"]["cpu"] = CPU
    body["spec"]["probes"] = {"drainTimeoutSeconds": DRAIN_S}
    # float32: the failover test below holds a resumed stream equal to an uninterrupted one,
    # which bfloat16 matrices (dtype auto on a CPU with AMX) do not promise.
    body["spec"]["engine"]["dtype"] = "Float32"
    (tmp_path / "md.yaml").write_text(yaml.safe_dump(body))
    start = time.monotonic()
    _kubectl(cluster, "apply", "-f", str(tmp_path / "md.yaml"))
    _wait_replicas(cluster, "smollm2", 1, 300, "smollm2 Ready")
    print(json.dumps({"apply_to_ready_s": round(time.monotonic() - start, 1)}))
    # The image's kernels served: no compiler ran inside the pod's memory limit.
    assert "CPU kernels: prebuilt for" in _log(cluster, _pods(cluster, "smollm2")[0])

    request = {"model": "smollm2", "messages": [QUESTION], "max_tokens": 16, "temperature": 0}
    direct = _post(_service_url(cluster, "models", "smollm2") + "/v1/chat/completions", request)
    assert direct["status"] == 200, direct
    answer = direct["body"]["choices"][0]["message"]["content"]
    assert "Paris" in answer
    through = _post(_gateway(cluster) + "/v1/chat/completions", request)
    assert through["status"] == 200, through
    assert through["body"]["choices"][0]["message"]["content"] == answer


def test_kubectl_scale_to_two_a_pod_killed_mid_stream_through_the_gateway_and_back_to_one(
    cluster,
):
    """`kubectl scale` to 2; a pod killed without a drain while it streams through the gateway,
    which goes on from the other replica to the same text as an uninterrupted completion;
    `kubectl scale` back to 1. The uninterrupted one is asked for while the second replica
    loads (the first serves it), not after."""
    _kubectl(cluster, "scale", "modeldeployment/smollm2", "--replicas=2")
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": RESUMED_TOKENS}
    body |= {"temperature": 0, "ignore_eos": True}
    url = _gateway(cluster) + "/v1/completions"
    whole = _post(url, body)  # uninterrupted, for comparison
    assert whole["status"] == 200, whole
    _wait_replicas(cluster, "smollm2", 2, 300, "two ready replicas")
    stream = body | {"stream": True, "stream_options": {"include_usage": True}}
    with _client("stream", url, json.dumps(stream), _gateway(cluster) + "/ready") as client:
        assert client.stdout is not None
        try:
            events = [json.loads(client.stdout.readline())]
            assert events[0] == {"event": "streaming"}, events
            (serving,) = [p for p in _pods(cluster, "smollm2") if _running(p)]
            # No preStop, no drain: the kubelet kills the container.
            name = serving["metadata"]["name"]
            _kubectl(cluster, "delete", "pod", name, "--grace-period=0", "--force")
            events += [json.loads(line) for line in client.stdout]
            _, err = client.communicate(timeout=60)
        finally:
            client.kill()
    assert client.returncode == 0, err[-2000:]
    end = events[-1]
    assert end["event"] == "end" and end["done"] and end["finish_reason"] == "length", end
    assert end["text"] == whole["body"]["choices"][0]["text"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cache hits may differ
    assert [end["usage"][k] for k in counts] == [whole["body"]["usage"][k] for k in counts]
    # The Service spreads requests over the chart's two gateway pods: the one that resumed is
    # found by asking each.
    resumed = [
        (s.labels, s.value)
        for pod in _gateway_pods(cluster)
        for family in text_string_to_metric_families(_text(f"http://{pod}:8080/metrics"))
        for s in family.samples
        if s.name == names.GATEWAY_RESUMES
    ]
    assert sum(value for _, value in resumed) >= 1, resumed
    print(json.dumps({"resumed": {k: v for k, v in end.items() if k != "text"}, "why": resumed}))
    _kubectl(cluster, "scale", "modeldeployment/smollm2", "--replicas=1")
    _wait_replicas(cluster, "smollm2", 1, 180, "one replica again")
    assert cluster.get(DEPLOYMENTS, "smollm2")["spec"]["replicas"] == 1


def _text(url: str) -> str:
    answer = _post(url, {}, command="text")
    assert answer["status"] == 200, answer
    return answer["text"]


def _gateway_pods(cluster: Cluster) -> list[str]:
    """The IPs of the gateway's running pods."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    params = {"labelSelector": "app.kubernetes.io/name=kvpilot-gateway"}
    with cluster.plane.client() as http:
        pods = http.get(path, params=params).json().get("items", [])
    return [p["status"]["podIP"] for p in pods if p["status"].get("podIP")]


def _running(pod: dict) -> bool:
    """Whether the pod is generating now, from its /metrics."""
    text = _text(f"http://{pod['status']['podIP']}:8000/metrics")
    return any(
        s.value > 0
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == names.REQUESTS_RUNNING
    )


def test_a_pod_deleted_while_it_streams_drains_the_stream_to_its_end(cluster):
    """The kubelet runs preStop, then SIGTERM: the pod stops being ready (seen on its /ready
    while the stream runs) and finishes what it was generating before it exits."""
    (pod,) = _pods(cluster, "smollm2")
    ip = pod["status"]["podIP"]
    # ignore_eos: all of them. At this pod's pace (0.7 of a core) long enough to outlast
    # preStop's sleep, and short enough to end inside the drain timeout (DRAIN_S), where the
    # server ends what is left with an error event.
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": TOKENS}
    body |= {"temperature": 0, "ignore_eos": True, "stream": True}
    body |= {"stream_options": {"include_usage": True}}
    url = _service_url(cluster, "models", "smollm2") + "/v1/completions"
    with _client("stream", url, json.dumps(body), f"http://{ip}:8000/ready") as client:
        assert client.stdout is not None
        try:
            events = [json.loads(client.stdout.readline())]
            assert events[0] == {"event": "streaming"}, events
            cluster.delete(PODS, pod["metadata"]["name"])
            events += [json.loads(line) for line in client.stdout]
            _, err = client.communicate(timeout=60)
        finally:
            client.kill()
    assert client.returncode == 0, err[-2000:]
    kinds = [e["event"] for e in events]
    assert kinds == ["streaming", "draining", "end"], events  # SIGTERM came mid-stream
    end = events[-1]
    assert end["done"] and end["finish_reason"] == "length", end
    assert end["usage"]["completion_tokens"] == TOKENS
    print(json.dumps({"drain": {k: v for k, v in end.items() if k != "text"}, "events": events[1]}))

    # The Deployment replaces the pod (that a new pod turns Ready, the tests above show): the
    # next test deletes the model with it.
    def replaced() -> list[dict]:
        pods = _pods(cluster, "smollm2")
        return [p for p in pods if p["metadata"]["name"] != pod["metadata"]["name"]]

    wait_for("a new pod", replaced, timeout=60, interval=0.5)


def test_deleting_the_model_deployment_takes_its_pods_and_service(cluster):
    cluster.delete(MD, "smollm2")

    def gone() -> bool:
        return not (
            cluster.get(DEPLOYMENTS, "smollm2")
            or cluster.get(SERVICES, "smollm2")
            or _pods(cluster, "smollm2")
        )

    wait_for("the Deployment, Service and pods to go", gone, timeout=120, interval=1)


def test_a_model_at_zero_is_woken_by_a_request_held_in_the_gateway(cluster):
    autoscaling = {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "targetQueueDepth": 4}
    autoscaling |= {"intervalSeconds": 2}
    spec = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "engine": {"maxModelLen": 2048},
        "resources": {"gpus": 0, "cpu": CPU, "memory": "4Gi"},
        "replicas": 0,
        "autoscaling": autoscaling,
    }
    cluster.create(MD, {"metadata": {"name": "sleepy"}, "spec": spec})
    wait_for("the operator's status", lambda: _status(cluster, "sleepy").get("conditions"))
    assert not _pods(cluster, "sleepy")
    request = {"model": "sleepy", "messages": [QUESTION], "max_tokens": 16, "temperature": 0}
    start = time.monotonic()
    answer = _post(_gateway(cluster) + "/v1/chat/completions", request)
    print(json.dumps({"from_zero_to_answer_s": round(time.monotonic() - start, 1)}))
    assert answer["status"] == 200, answer
    assert "Paris" in answer["body"]["choices"][0]["message"]["content"]
    assert cluster.get(MD, "sleepy")["spec"]["replicas"] == 1
    woke = [
        e
        for e in cluster.list(EVENTS)
        if e["involvedObject"]["name"] == "sleepy" and e["reason"] == "ScaledUp"
    ]
    assert woke and "held" in woke[0]["message"], woke


def test_the_autoscaler_adds_a_replica_under_load_and_removes_it_after(cluster, tmp_path):
    """`kvpilot bench` through the gateway from inside the cluster: the operator's pod scrapes
    the model's pods, sees p95 time to first token over its target, adds the second replica,
    and removes it once the load has stopped; no request fails on the way."""
    scaling = {"minReplicas": 1, "maxReplicas": 2, "targetLatencyP95Milliseconds": 100}
    scaling |= {"windowSeconds": 10, "scaleDown": {"stabilizationSeconds": 10}}
    cluster.patch(MD, "sleepy", {"spec": {"autoscaling": scaling}})
    report, workload = tmp_path / "bench.json", tmp_path / "workload.yaml"
    workload.write_text(yaml.safe_dump(LOAD))
    bench = [str(Path(sys.executable).parent / "kvpilot"), "bench", "--url", _gateway(cluster)]
    bench += ["--model", "sleepy", "--workload", str(workload), "--seed", "1"]
    bench += ["--no-progress", "--json-out", str(report)]
    argv = ["nsenter", f"--net=/run/netns/{NETNS}", "--", *bench]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as load:
        try:
            wait_for(
                "a second replica under load",
                lambda: (
                    cluster.get(MD, "sleepy")["spec"]["replicas"] == 2 or load.poll() is not None
                ),
                timeout=120,
                interval=1,
            )
            out, _ = load.communicate(timeout=180)
        finally:
            load.kill()
    assert load.returncode == 0, out[-3000:]
    totals = json.loads(report.read_text())["runs"][0]["totals"]
    print(json.dumps({"scale_up_load": {k: totals[k] for k in ("sent", "ok", "ttft_ms")}}))
    assert totals["sent"] > 0 and totals["ok"] == totals["sent"], totals
    scaled = [
        e["message"]
        for e in cluster.list(EVENTS)
        if e["involvedObject"]["name"] == "sleepy" and e["reason"] == "ScaledUp"
    ]
    assert any("1 -> 2" in message for message in scaled), scaled
    _wait_replicas(cluster, "sleepy", 1, 180, "back to one replica after the load")


def _claim_of_adapters(cluster: Cluster, folder: Path) -> None:
    """A PersistentVolumeClaim `adapters` for a hostPath volume of `folder`, on this machine,
    which is the node (kube-controller-manager's binder binds the two, later)."""
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "kvpilot-test-adapters"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": "models", "name": "adapters"},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "adapters"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
            "volumeName": "kvpilot-test-adapters",
        },
    }
    with cluster.plane.client() as http:
        http.post("/api/v1/persistentvolumes", json=volume).raise_for_status()
        claims = cluster.path("/api/v1/namespaces/{ns}/persistentvolumeclaims")
        http.post(claims, json=claim).raise_for_status()


def _chat(cluster: Cluster, model: str) -> dict:
    request = {"model": model, "messages": [QUESTION], "max_tokens": 8, "temperature": 0}
    return _post(_gateway(cluster) + "/v1/chat/completions", request)


def test_lora_adapters_from_a_claim_and_one_added_without_a_restart(cluster, tmp_path_factory):
    """Two adapters in the spec at `kubectl apply`: both listed by the gateway with the model as
    parent and answering; a third appended to the spec is loaded by the running pod (the
    kubelet refreshes the mounted list) and answers, with the same pod, never restarted."""

    # Beside sleepy's one replica: the operator (100m), the gateway (2 x 200m) and two models
    # at CPU each fit the node's two cores.
    def bound() -> bool:
        found = cluster.plane.get("/api/v1/namespaces/models/persistentvolumeclaims/adapters")
        return (found or {}).get("status", {}).get("phase") == "Bound"

    wait_for("the adapters' claim (the adapters fixture's) to be bound", bound, 60, interval=0.5)
    adapters = [{"name": n, "source": f"pvc://adapters/{n}"} for n in ("formal", "terse")]
    spec = {
        "model": {"source": "builtin://smollm2-135m-instruct", "servedModelName": "tuned"},
        "adapters": adapters,
        "engine": {"maxModelLen": 2048, "maxLoras": 2, "maxLoraRank": 8},
        "resources": {"gpus": 0, "cpu": CPU, "memory": "4Gi"},
        "replicas": 1,
    }
    manifest = tmp_path_factory.mktemp("tuned") / "md.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kvpilot.dev/v1alpha1",
                "kind": "ModelDeployment",
                "metadata": {"name": "tuned"},
                "spec": spec,
            }
        )
    )
    _kubectl(cluster, "apply", "-f", str(manifest))
    _wait_replicas(cluster, "tuned", 1, 300, "tuned Ready")
    (pod,) = _pods(cluster, "tuned")
    listed = _post(_gateway(cluster) + "/v1/models", {}, "get")
    cards = {c["id"]: c for c in listed["body"]["data"]}
    assert cards["formal"]["parent"] == "tuned" and cards["terse"]["parent"] == "tuned", cards
    answers = {name: _chat(cluster, name) for name in ("tuned", "formal", "terse")}
    for name, answer in answers.items():
        assert answer["status"] == 200 and answer["body"]["model"] == name, answer
    assert _chat(cluster, "pirate")["status"] == 404

    spec["adapters"].append({"name": "pirate", "source": "pvc://adapters/pirate"})
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kvpilot.dev/v1alpha1",
                "kind": "ModelDeployment",
                "metadata": {"name": "tuned"},
                "spec": spec,
            }
        )
    )
    start = time.monotonic()
    _kubectl(cluster, "apply", "-f", str(manifest))
    served = wait_for(
        "the third adapter to answer",
        lambda: (answer := _chat(cluster, "pirate"))["status"] == 200 and answer,
        timeout=180,
        interval=2,
    )
    print(json.dumps({"adapter_added_to_servable_s": round(time.monotonic() - start, 1)}))
    assert served["body"]["model"] == "pirate"
    (after,) = _pods(cluster, "tuned")
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]  # the same pod
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0

    def reported() -> bool:
        loaded = _status(cluster, "tuned").get("loadedAdapters") or []
        return [r["adapters"] for r in loaded] == [["formal", "pirate", "terse"]]

    wait_for("status.loadedAdapters to list all three", reported, timeout=60, interval=1)
