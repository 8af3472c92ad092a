"""Operator benchmark against a real control plane on 127.0.0.1 (etcd, kube-apiserver,
kube-controller-manager, the chart installed with helm: tests/kube), the real `kvpilot
operator` process under the chart's ServiceAccount, timed from the client's side. Prints one
JSON document.

1. Apply -> children: ModelDeployments created one at a time; time until its Deployment and
   Service exist (p50, p95).
2. Bulk: N ModelDeployments created back to back; time until every one has its Deployment and a
   status for its generation.
3. Idle: with the N ModelDeployments and their (Pending) pods in place and nothing changing, the
   operator's API requests per minute, by verb and resource, from the API server's audit log.
4. Ready to status: a pod of a fresh ModelDeployment reported ready (by the test's node, as a
   kubelet would); time until the ModelDeployment's Ready condition is True (p50, p95).

Needs the control plane's binaries: scripts/controlplane.sh.
"""

import argparse
import collections
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

from kvpilot_testing import results
from kvpilot_testing.kube.cluster import (
    DEPLOYMENTS,
    MD,
    SERVICES,
    Cluster,
    create_namespace,
    wait_for,
)
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.install import install
from kvpilot_testing.kube.node import Node

ROOT = Path(__file__).resolve().parents[1]


def _body(name: str) -> dict:
    body = yaml.safe_load((ROOT / "crds/samples/builtin-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    return body


def main() -> None:
    run = results.Run.start("operator_reconcile")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=30, help="one-at-a-time applies")
    parser.add_argument("--bulk", type=int, default=200, help="ModelDeployments in the bulk run")
    parser.add_argument("--idle", type=float, default=60, help="seconds of the idle measurement")
    parser.add_argument("--ready", type=int, default=20, help="pod-ready -> status runs")
    results.add_argument(parser)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvpilot-bench-"))
    plane = ControlPlane(workdir / "plane")
    cluster: Cluster | None = None
    try:
        plane.start(controller_manager=False)
        installed = install(plane, "--set", "watch.scope=All")
        plane.start_controller_manager()
        version = (plane.get("/version") or {}).get("gitVersion")
        create_namespace(plane, "bench")
        cluster = Cluster(plane, "bench", installed.operator_kubeconfig)
        # Every namespace, as the chart installed with watch.scope=All runs it: one named
        # namespace would have kopf list namespaces, which that scope does not grant.
        cluster.start_operator(workdir / "operator.log", namespaces=())
        cluster.wait_for_operator()
        single = []
        for i in range(args.single):
            name, start = f"single-{i}", time.perf_counter()
            cluster.create(MD, _body(name))
            wait_for(
                name,
                lambda n=name: cluster.get(DEPLOYMENTS, n) and cluster.get(SERVICES, n),
                timeout=60,
            )
            single.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        for i in range(args.bulk):
            cluster.create(MD, _body(f"bulk-{i}"))
        created = time.perf_counter() - start

        def all_reconciled() -> bool:
            deployments = {d["metadata"]["name"] for d in cluster.list(DEPLOYMENTS)}
            observed = [
                m
                for m in cluster.list(MD)
                if m["metadata"]["name"].startswith("bulk-")
                and m.get("status", {}).get("observedGeneration") == 1
                and m["metadata"]["name"] in deployments
            ]
            return len(observed) == args.bulk

        wait_for("every bulk ModelDeployment", all_reconciled, timeout=600, interval=0.5)
        bulk_s = time.perf_counter() - start
        # The controller manager is still making a pod per Deployment (at its client's rate
        # limit): idle starts once each has its pod.
        wait_for("every pod", lambda: _all_pods_made(cluster), timeout=900, interval=1)
        idle = _idle_requests(plane, installed.operator_user, args.idle)
        ready = _ready_to_status(plane, installed.operator_kubeconfig, args.ready)
    finally:
        if cluster is not None:
            cluster.close()
        plane.stop()
    report = {
        "api_server": f"kube-apiserver {version} + etcd on 127.0.0.1 (tests/kube)",
        "apply_to_children_ms": _percentiles(single),
        "bulk": {
            "model_deployments": args.bulk,
            "create_requests_s": round(created, 2),
            "all_reconciled_s": round(bulk_s, 2),
            "per_second": round(args.bulk / bulk_s, 1),
        },
        "idle": idle,
        "pod_ready_to_status_ms": ready,
    }
    print(json.dumps(report, indent=2))
    if args.record:
        run.record(_figures(report), "none in the same run", report)


def _figures(report: dict) -> list[results.Figure]:
    bulk, idle = report["bulk"], report["idle"]["requests_per_minute"]
    applied, ready = report["apply_to_children_ms"], report["pod_ready_to_status_ms"]
    created = f"{bulk['model_deployments']} created back to back, all reconciled"
    return [
        results.figure("apply to Deployment and Service, p50", "ms", applied["p50"]),
        results.figure("apply to Deployment and Service, p95", "ms", applied["p95"]),
        results.figure(created, "s", bulk["all_reconciled_s"]),
        results.figure("operator API requests while idle", "per minute", idle),
        results.figure("pod ready to Ready=True, p50", "ms", ready["p50"]),
        results.figure("pod ready to Ready=True, p95", "ms", ready["p95"]),
    ]


def _ready_to_status(plane: ControlPlane, kubeconfig: Path, runs: int) -> dict:
    """In a namespace of its own (so the node binds only these pods), with the operator of
    the first namespace watching every namespace."""
    create_namespace(plane, "bench-ready")
    cluster = Cluster(plane, "bench-ready", kubeconfig)
    node, latencies = Node(cluster), []
    for i in range(runs):
        name = f"ready-{i}"
        cluster.create(MD, _body(name))
        wait_for("its pod", lambda n=name: _pods_of(cluster, n), timeout=60)
        start = time.perf_counter()
        node.sync()
        wait_for("Ready", lambda n=name: _is_ready(cluster, n), timeout=60, interval=0.005)
        latencies.append((time.perf_counter() - start) * 1000)
    cluster.close()
    return _percentiles(latencies)


def _all_pods_made(cluster: Cluster) -> bool:
    deployments = cluster.list(DEPLOYMENTS)
    return all(d.get("status", {}).get("replicas") == d["spec"]["replicas"] for d in deployments)


def _pods_of(cluster: Cluster, name: str) -> list[dict]:
    pods = cluster.list("/api/v1/namespaces/{ns}/pods")
    return [p for p in pods if p["metadata"]["name"].startswith(f"{name}-")]


def _is_ready(cluster: Cluster, name: str) -> bool:
    conditions = (cluster.get(MD, name) or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _percentiles(values: list[float]) -> dict:
    quantiles = statistics.quantiles(values, n=20)
    return {
        "runs": len(values),
        "p50": round(statistics.median(values), 1),
        "p95": round(quantiles[18], 1),
    }


def _idle_requests(plane: ControlPlane, user: str, seconds: float) -> dict:
    """The operator's requests while nothing changes, per minute, from the audit log."""
    start = time.time()
    time.sleep(seconds)
    end = time.time()
    counts: collections.Counter[str] = collections.Counter()
    for event in plane.audit(user):
        when = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        if event["stage"] == "ResponseComplete" and start <= when < end:
            ref = event.get("objectRef", {})
            what = ref.get("resource", "?") + (
                f"/{ref['subresource']}" if "subresource" in ref else ""
            )
            counts[f"{event['verb']} {what}"] += 1
    per_minute = 60 / (end - start)
    return {
        "seconds": round(end - start, 1),
        "requests_per_minute": round(sum(counts.values()) * per_minute, 1),
        "by_call_per_minute": {k: round(v * per_minute, 1) for k, v in counts.most_common()},
    }


if __name__ == "__main__":
    main()
