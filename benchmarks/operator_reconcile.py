"""Operator benchmark against the Kubernetes API stand-in (kmock over HTTP on 127.0.0.1): the
real `kvpilot operator` process, timed from the client's side. Prints one JSON document.

1. Apply -> children: ModelDeployments created one at a time; time until its Deployment and
   Service exist (p50, p95).
2. Bulk: N ModelDeployments created back to back; time until every one has its Deployment and a
   status for its generation.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.operator.kube_cluster import DEPLOYMENTS, MD, StandInCluster, wait_for  # noqa: E402

SERVICES = "/api/v1/namespaces/{ns}/services"


def _body(name: str) -> dict:
    body = yaml.safe_load((ROOT / "crds/samples/builtin-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=30, help="one-at-a-time applies")
    parser.add_argument("--bulk", type=int, default=200, help="ModelDeployments in the bulk run")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvpilot-bench-"))
    cluster = StandInCluster(workdir)
    # Status refreshes every 10 s, as in production: the bulk run measures reconciling.
    cluster.start_operator(workdir / "operator.log", status_interval=10)
    try:
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
    finally:
        cluster.close()
    quantiles = statistics.quantiles(single, n=20)
    print(
        json.dumps(
            {
                "stand_in": "kmock KubernetesEmulator over HTTP on 127.0.0.1",
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
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
