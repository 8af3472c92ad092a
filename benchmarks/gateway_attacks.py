"""The gateway's memory under the attacks that once exhausted it, on loopback: the real control
plane (the chart installed by helm), a ModelDeployment at zero replicas that nothing wakes (no
operator runs), and the real `kvpilot gateway`. Prints one JSON document: per attack what the
attacker got and the gateway's RSS before and at its peak (sampled while the attack runs).

1. header_flood: six clients at once, each sending GET /health with one header 100 MiB long.
2. held_small_objects: twelve requests for the sleeping model, each a 4 MiB body of small JSON
   objects (the shape that costs the most once parsed), held open 3 s.
3. held_empty_arrays: the same with a body of empty arrays (a shape whose parse cannot be
   trimmed as it runs; see gateway/kvpilot_gateway/target.py).
4. held_qualified: eight clients, each from an address of its own (so each has its share of
   the budget), sending 4 MiB bodies of small objects that name the model with its namespace
   (`bench/asleep`): the name the replica knows goes into the body, which once cost a parse
   and a rewrite of the whole body.

`--gateway-src DIR` runs the gateway from another checkout (PYTHONPATH=DIR/server:...): the same
attacks against an older gateway, for a before/after in one run, e.g. a `git worktree` of an
earlier commit. Needs the control plane's binaries: scripts/controlplane.sh.
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from kvpilot_testing import gateway_attacks, results
from kvpilot_testing.kube.cluster import MD, Cluster, create_namespace, wait_for
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.install import install

ASLEEP = "asleep"
ATTACKS = ("header_flood", "held_small_objects", "held_empty_arrays", "held_qualified")
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 0,
    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "targetQueueDepth": 4},
}


def _empty_arrays_body(size: int) -> bytes:
    head = json.dumps({"model": ASLEEP, "prompt": "hi", "max_tokens": 1}).encode()[:-1]
    return head + b', "user_data": [' + b"[]," * max(0, (size - 200) // 3) + b"[]]}"


def _attacks(gateway: Gateway, clients: int, size: int, hold: float) -> dict:
    assert gateway.process is not None
    pid = gateway.process.pid
    out: dict = {"idle_rss_mib": round(gateway_attacks.rss_mib(pid), 1)}
    out["header_flood"] = gateway_attacks.header_flood(gateway.url, pid, clients=6)
    time.sleep(1)
    out["held_small_objects"] = gateway_attacks.held_bodies(
        gateway.url, pid, ASLEEP, clients=clients, size=size, hold=hold
    )
    time.sleep(1)
    out["held_empty_arrays"] = gateway_attacks.held_bodies(
        gateway.url, pid, ASLEEP, clients, size, hold, body=_empty_arrays_body(size)
    )
    time.sleep(1)
    out["held_qualified"] = gateway_attacks.held_bodies(
        gateway.url, pid, f"bench/{ASLEEP}", clients=8, size=size, hold=hold, spread=True
    )
    for name in ATTACKS:
        attack = out[name]
        attack["peak_above_idle_mib"] = round(attack["rss_peak_mib"] - out["idle_rss_mib"], 1)
    return out


def main() -> None:
    run = results.Run.start("gateway_attacks")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway-src", type=Path, help="run the gateway from this checkout")
    parser.add_argument("--clients", type=int, default=12, help="held requests per attack")
    parser.add_argument("--body-bytes", type=int, default=(4 << 20) - 4096)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each holds")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    results.add_argument(parser)
    args = parser.parse_args()
    env = {}
    if args.gateway_src:
        src = args.gateway_src.resolve()
        env["PYTHONPATH"] = os.pathsep.join(str(src / p) for p in ("server", "gateway", "operator"))
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="kvpilot-bench-gateway-attacks-"))
    plane = ControlPlane(workdir / "plane")
    cluster: Cluster | None = None
    gateway: Gateway | None = None
    try:
        plane.start(controller_manager=False)
        installed = install(plane, "--set", "watch.scope=All")
        plane.start_controller_manager()  # it makes the namespace's default ServiceAccount
        create_namespace(plane, "bench")
        cluster = Cluster(plane, "bench", installed.operator_kubeconfig)
        cluster.create(MD, {"metadata": {"name": ASLEEP}, "spec": SPEC})
        gateway = Gateway(
            installed.gateway_kubeconfig or plane.kubeconfig,
            "bench",
            workdir / "gateway.log",
            *("--hold-timeout", "120"),
            env=env,
        ).start()

        def listed() -> bool:
            return any(
                m["id"] == ASLEEP for m in httpx.get(f"{gateway.url}/v1/models").json()["data"]
            )

        wait_for("the gateway to list the model", listed, 30, 0.1)
        measured = _attacks(gateway, args.clients, args.body_bytes, args.hold)
    except BaseException:
        print(f"kept for a look: {workdir}", file=sys.stderr)
        raise
    finally:
        for stop in (gateway and gateway.stop, cluster and cluster.close):
            if stop:
                stop()
        plane.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
        },
        "gateway_src": str(args.gateway_src or "this checkout"),
        "params": {"clients": args.clients, "body_bytes": args.body_bytes, "hold_s": args.hold},
        "goal_peak_above_idle_mib": 100,
        **measured,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.record:
        peak = "peak_above_idle_mib"
        figures = [
            results.figure(f"{a}: RSS peak above idle", "MiB", report[a][peak]) for a in ATTACKS
        ]
        figures.append(results.figure("idle RSS", "MiB", report["idle_rss_mib"]))
        run.record(figures, "none (the goal: at most 100 MiB above idle)", report)


if __name__ == "__main__":
    main()
