"""Operator benchmark against a real control plane on 127.0.0.1 (etcd, kube-apiserver,
kube-controller-manager, the chart installed with helm: tests/kube), the real `kvpilot
operator` process under the chart's ServiceAccount, timed from the client's side. Prints one
JSON document.

1. Apply -> children: ModelDeployments created one at a time; time until its Deployment and
   Service exist (p50, p95).
2. Bulk: N ModelDeployments created back to back; time until every one has its Deployment and a
   status for its generation.
3. Idle: with the N ModelDeployments in place and nothing changing, the operator's API requests
   per minute, by verb and resource, from the API server's audit log (the status timer's cost).

Needs the control plane's binaries: scripts/controlplane.sh.
"""

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.kube.cluster import (  # noqa: E402
    DEPLOYMENTS,
    MD,
    SERVICES,
    Cluster,
    create_namespace,
    wait_for,
)
from tests.kube.controlplane import ControlPlane  # noqa: E402
from tests.kube.install import install  # noqa: E402


def _body(name: str) -> dict:
    body = yaml.safe_load((ROOT / "crds/samples/builtin-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=30, help="one-at-a-time applies")
    parser.add_argument("--bulk", type=int, default=200, help="ModelDeployments in the bulk run")
    parser.add_argument("--idle", type=float, default=60, help="seconds of the idle measurement")
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
        cluster.start_operator(workdir / "operator.log")
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
        idle = _idle_requests(plane, installed.operator_user, args.idle)
    finally:
        if cluster is not None:
            cluster.close()
        plane.stop()
    quantiles = statistics.quantiles(single, n=20)
    print(
        json.dumps(
            {
                "api_server": f"kube-apiserver {version} + etcd on 127.0.0.1 (tests/kube)",
                "apply_to_children_ms": {
                    "runs": len(single),
                    "p50": round(statistics.median(single), 1),
                    "p95": round(quantiles[18], 1),
                },
                "bulk": {
                    "model_deployments": args.bulk,
                    "create_requests_s": round(created, 2),
                    "all_reconciled_s": round(bulk_s, 2),
                    "per_second": round(args.bulk / bulk_s, 1),
                },
                "idle": idle,
            },
            indent=2,
        )
    )


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
