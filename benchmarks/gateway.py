"""Gateway benchmark on loopback: the real control plane with the chart installed by helm, the
real operator, the test's kubelet running a real `kvpilot serve` (tiny model) as the pod, and
the real `kvpilot gateway` under its chart ServiceAccount. Prints one JSON document.

1. Added latency: the same request direct to the pod's server and through the gateway, in
   interleaved pairs (which goes first alternates) so drift hits both alike; p50/p99 of each
   and of the per-pair difference. Kinds: a completion, a stream's first byte, a request the
   server refuses before its engine (the proxy path alone), and /v1/models (the gateway answers
   it from its catalog: not proxied, for reference).
2. Held streams: K streams at once for a model with no replica (the operator is stopped by
   then, so nothing wakes it); the gateway's RSS before and with K held; then the clients
   leave and the held count must return to 0. The largest level runs twice: RSS that keeps
   growing on the repeat would be a leak.

Needs the control plane's binaries: scripts/controlplane.sh.
"""

import argparse
import asyncio
import collections
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_server.models.builtin import builtin_path
from kvpilot_testing import results
from kvpilot_testing.kube.cluster import MD, Cluster, create_namespace, wait_for
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.install import install
from kvpilot_testing.kube.node import PORT, Node, serve_tiny
from kvpilot_testing.tiny import build_tiny_model

SERVED, ASLEEP = "alpha", "asleep"
HELD = names.GATEWAY_HELD
HOLD_COUNT = f"{names.GATEWAY_HOLD_SECONDS}_count"  # the histogram's count sample
# Sockets the benchmark itself needs beside the held streams (the plane's client, logs, ...).
FD_RESERVE = 256


def _spec(replicas: int, autoscaling: bool) -> dict:
    spec: dict = {
        "model": {"source": "builtin://smollm2-135m-instruct"},
        "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
        "replicas": replicas,
    }
    if autoscaling:
        spec["autoscaling"] = dict(enabled=True, minReplicas=0, maxReplicas=1, targetQueueDepth=4)
    return spec


def main() -> None:
    run = results.Run.start("gateway")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="direct/gateway pairs per kind")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured pairs per kind")
    parser.add_argument(
        "--held", type=int, nargs="+", default=[250, 500, 1000], help="held-stream levels"
    )
    parser.add_argument("--quick", action="store_true", help="20 pairs, 20 held (smoke test)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    results.add_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.warmup, args.held = 20, 3, [20]
    # Each held stream is one socket here and one in the gateway (which inherits this limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cap = hard - FD_RESERVE
    levels = sorted({min(k, cap) for k in args.held})
    started, load_before = time.monotonic(), os.getloadavg()

    workdir = Path(tempfile.mkdtemp(prefix="kvpilot-bench-gateway-"))
    plane = ControlPlane(workdir / "plane")
    cluster: Cluster | None = None
    node: Node | None = None
    gateway: Gateway | None = None
    try:
        tiny = build_tiny_model("llama", workdir / "tiny", builtin_path("smollm2-135m-instruct"))
        plane.start(controller_manager=False)
        installed = install(plane, "--set", "watch.scope=All")
        plane.start_controller_manager()
        create_namespace(plane, "bench")
        cluster = Cluster(plane, "bench", installed.operator_kubeconfig)
        node = Node(cluster, *serve_tiny(tiny))
        node.start(interval=0.2)
        cluster.create(MD, {"metadata": {"name": SERVED}, "spec": _spec(1, False)})
        # Every namespace, as the chart installed with watch.scope=All runs it: one named
        # namespace would have kopf list namespaces, which that scope does not grant.
        cluster.start_operator(workdir / "operator.log", namespaces=())
        cluster.wait_for_operator()
        most = max(levels) + 1
        gateway = Gateway(
            installed.gateway_kubeconfig or plane.kubeconfig,
            "bench",
            workdir / "gateway.log",
            *("--max-held", str(most), "--max-held-per-model", str(most)),
            *("--hold-timeout", "300"),
        ).start()
        wait_for("the replica ready at the gateway", lambda: _ready(gateway, SERVED), 300, 0.2)
        # The held model must never wake: with the operator gone nothing scales it up.
        cluster.stop_operator()
        cluster.create(MD, {"metadata": {"name": ASLEEP}, "spec": _spec(0, True)})
        wait_for("the gateway to list it", lambda: _ready(gateway, ASLEEP) is False, 30, 0.1)
        direct = f"http://{node.addresses()[0]}:{PORT}"
        served = [m["id"] for m in httpx.get(f"{direct}/v1/models").json()["data"]]
        assert served == [SERVED], f"{direct} is not this benchmark's server: {served}"
        latency = _latency(direct, gateway.url, args.pairs, args.warmup)
        # Per held request against one baseline taken before any holding: memory freed after a
        # smaller level stays with the process and would hide part of the next level's cost.
        assert gateway.process is not None
        baseline = _rss_kib(gateway.process.pid)
        held = [asyncio.run(_hold(gateway, k, baseline)) for k in [*levels, levels[-1]]]
    except BaseException:
        print(f"kept for a look: {workdir}", file=sys.stderr)
        raise
    finally:
        for stop in (gateway and gateway.stop, node and node.stop, cluster and cluster.close):
            if stop:
                stop()
        plane.stop()
    shutil.rmtree(workdir, ignore_errors=True)

    added = latency["completion"]["added_ms"]["p50"]
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": results.cpu()[0],
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "fd_limit": {"soft_was": soft, "hard": hard},
        },
        "params": {"pairs": args.pairs, "warmup": args.warmup, "held_levels": levels},
        "setup": "kvpilot serve (tiny llama, CPU) on a 127.0.0.x as the pod; gateway on "
        "127.0.0.1, routing prefix-load, one replica; httpx clients with keep-alive",
        "latency": latency,
        "target": {"added_p50_ms_at_most": 1.0, "added_p50_ms": added, "met": added <= 1.0},
        "held": held,
        "rss_growth_on_repeat_kib": held[-1]["gateway_rss_kib"]["held"]
        - held[-2]["gateway_rss_kib"]["held"],
        "wall_s": round(time.monotonic() - started, 1),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.record:
        run.record(_figures(report), "the same request sent straight to the pod", report)


def _figures(report: dict) -> list[results.Figure]:
    figures = [
        results.figure(f"{kind} p50", "ms", sides["gateway_ms"]["p50"], sides["direct_ms"]["p50"])
        for kind, sides in report["latency"].items()
    ]
    added = report["latency"]["completion"]["added_ms"]["p50"]
    figures.append(results.figure("completion: added p50 (per pair)", "ms", added))
    last = report["held"][-1]
    held = f"gateway memory per held stream ({last['held']} held)"
    figures.append(results.figure(held, "bytes", last["bytes_per_held"]))
    return figures


def _ready(gateway: Gateway, model: str) -> bool | None:
    """The model's readiness in the gateway's /v1/models; None while it is not listed."""
    try:
        cards = httpx.get(f"{gateway.url}/v1/models", timeout=5).json()["data"]
    except httpx.HTTPError:
        return None
    return next((card["ready"] for card in cards if card["id"] == model), None)


# -- 1. added latency ------------------------------------------------------------------------

Timed = Callable[[httpx.Client, str], float]


def _post(path: str, body: dict, status: int) -> Timed:
    def timed(client: httpx.Client, base: str) -> float:
        start = time.perf_counter()
        response = client.post(f"{base}{path}", json=body)
        elapsed = time.perf_counter() - start
        if response.status_code != status:  # both sides must do the same work
            raise RuntimeError(f"{base}{path}: {response.status_code} {response.text[:300]}")
        return elapsed

    return timed


def _first_byte(client: httpx.Client, base: str) -> float:
    body = {"model": SERVED, "prompt": "The river", "max_tokens": 8, "temperature": 0}
    start = time.perf_counter()
    with client.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        chunks = r.iter_raw()
        next(chunks)
        elapsed = time.perf_counter() - start
        for _ in chunks:  # the rest, so the connection is reused
            pass
    return elapsed


def _models(client: httpx.Client, base: str) -> float:
    start = time.perf_counter()
    client.get(f"{base}/v1/models").raise_for_status()
    return time.perf_counter() - start


KINDS: dict[str, Timed] = {
    "completion": _post(
        "/v1/completions",
        {"model": SERVED, "prompt": "The river", "max_tokens": 1, "temperature": 0},
        200,
    ),
    "stream_first_byte": _first_byte,
    # max_tokens 0 is refused by the server's request validation: no engine step.
    "proxy_only_400": _post(
        "/v1/completions", {"model": SERVED, "prompt": "x", "max_tokens": 0}, 400
    ),
    "models_not_proxied": _models,
}


def _latency(direct: str, gateway: str, pairs: int, warmup: int) -> dict:
    result = {}
    with httpx.Client(timeout=60) as to_direct, httpx.Client(timeout=60) as to_gateway:
        for kind, timed in KINDS.items():
            times: dict[str, list[float]] = {"direct": [], "gateway": []}
            for i in range(warmup + pairs):
                order = [("direct", to_direct, direct), ("gateway", to_gateway, gateway)]
                for side, client, base in order[:: 1 if i % 2 else -1]:
                    elapsed = timed(client, base) * 1000
                    if i >= warmup:
                        times[side].append(elapsed)
            added = [g - d for g, d in zip(times["gateway"], times["direct"], strict=True)]
            result[kind] = {
                "direct_ms": _percentiles(times["direct"]),
                "gateway_ms": _percentiles(times["gateway"]),
                "added_ms": _percentiles(added),
            }
    return result


def _percentiles(values: list[float]) -> dict:
    p99 = statistics.quantiles(values, n=100, method="inclusive")[98]
    return {"p50": round(statistics.median(values), 3), "p99": round(p99, 3)}


# -- 2. held streams -------------------------------------------------------------------------


async def _metric(probe: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await probe.get("/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def _until(probe: httpx.AsyncClient, value: float, timeout: float) -> float:
    """Seconds until the gateway's held gauge reads `value`."""
    start = time.monotonic()
    while await _metric(probe, HELD) != value:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"held never reached {value}: {await _metric(probe, HELD)}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _hold(gateway: Gateway, k: int, baseline_kib: int) -> dict:
    assert gateway.process is not None
    pid = gateway.process.pid
    body = {"model": ASLEEP, "prompt": "The river", "max_tokens": 8, "stream": True}
    answers: collections.Counter[str] = collections.Counter()

    async def one(client: httpx.AsyncClient) -> None:
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await response.aread()
                answers[str(response.status_code)] += 1  # none expected: nothing wakes it
        except httpx.HTTPError as exc:
            answers[type(exc).__name__] += 1

    limits = httpx.Limits(max_connections=k, max_keepalive_connections=0)
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as probe,
        httpx.AsyncClient(base_url=gateway.url, limits=limits, timeout=None) as client,
    ):
        closed_before = await _metric(probe, HOLD_COUNT, outcome="client_closed")
        rss_before = _rss_kib(pid)
        tasks = [asyncio.create_task(one(client)) for _ in range(k)]
        to_hold = await _until(probe, k, timeout=120)
        await asyncio.sleep(1)  # the announcer's writes and the GC settle
        rss_held = _rss_kib(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        still = await _metric(probe, HELD)
        for task in tasks:  # the clients leave: their connections close
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        to_release = await _until(probe, 0, timeout=60)
        closed = await _metric(probe, HOLD_COUNT, outcome="client_closed") - closed_before
        await asyncio.sleep(0.5)  # nothing comes back late
        after = await _metric(probe, HELD)
    return {
        "held": k,
        "still_held_after_1s": int(still),
        "seconds_to_hold_all": round(to_hold, 2),
        "gateway_rss_kib": {
            "baseline": baseline_kib,
            "before": rss_before,
            "held": rss_held,
            "after": _rss_kib(pid),
        },
        "bytes_per_held": round((rss_held - baseline_kib) * 1024 / k),
        "gateway_open_fds_held": fds,
        "answers_before_leaving": dict(answers),
        "released_as_client_closed": int(closed),
        "seconds_to_release_all": round(to_release, 2),
        "held_after_release": int(after),
    }


if __name__ == "__main__":
    main()
