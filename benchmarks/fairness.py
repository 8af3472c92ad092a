"""Tenants sharing one server: two light tenants' latency alone, beside a heavy tenant sending
ten times their requests, and the same beside it with fairness off (every key one tenant, so
arrival order decides), in one run on the bundled model. Prints one JSON document.

Each phase is `kvpilot bench --tenant ...` against a live `kvpilot serve` on loopback, with a
key file naming the tenants. Fairness off is the same server with the three keys given one
name: the engine's order and the admission queue then see one tenant, as a server without
per-tenant fairness would. The figures are the light tenants' time to first token (p50, p95)
and what each phase completed.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from kvpilot_testing import results
from kvpilot_testing.live_server import start_server, stop_server

MODEL = "builtin://smollm2-135m-instruct"
LIGHT = ("light-b", "light-c")


def workload(rate: float, duration: float) -> dict:
    return {
        "name": "tenants",
        "seed": 3,
        "duration_s": duration,
        "timeout_s": 600,
        "arrival": {"process": "poisson", "rate": rate},
        "classes": [
            {
                "name": "chat",
                "share": 1,
                "api": "chat",
                "stream": True,
                "prompt_tokens": {"dist": "uniform", "min": 48, "max": 96},
                "output_tokens": {"dist": "uniform", "min": 24, "max": 48},
            }
        ],
    }


def bench(base: str, wl: Path, tenants: list[str], out: Path) -> dict:
    command = [sys.executable, "-m", "kvpilot_common.cli", "bench", "--no-progress"]
    command += ["--url", base, "--workload", str(wl), "--json-out", str(out)]
    for tenant in tenants:
        command += ["--tenant", tenant]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return {r["label"]: r["totals"] for r in json.loads(out.read_text())["runs"]}


def light_figures(runs: dict) -> dict:
    def pick(totals: dict, key: str, q: int) -> float | None:
        return None if totals[key] is None else round(totals[key][f"p{q}"], 1)

    return {
        name: {
            "sent": runs[name]["sent"],
            "ok": runs[name]["ok"],
            "ttft_p50_ms": pick(runs[name], "ttft_ms", 50),
            "ttft_p95_ms": pick(runs[name], "ttft_ms", 95),
        }
        for name in LIGHT
    }


def serve(keys: Path, one_tenant: bool, args: argparse.Namespace):
    names = {"heavy": "heavy", **{n: n for n in LIGHT}}
    lines = [f"sk-{n} name={'everyone' if one_tenant else n}" for n in names]
    keys.write_text("\n".join(lines) + "\n")
    flags = ["--model", MODEL, "--api-key-file", str(keys), "--max-model-len", "1024"]
    flags += ["--max-num-seqs", str(args.max_num_seqs)]
    return start_server(*flags, timeout=600)


def main() -> None:
    run = results.Run.start("fairness")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.25, help="each light tenant's req/s")
    parser.add_argument("--heavy", type=float, default=10.0, help="the heavy tenant's multiple")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    results.add_argument(parser)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvpilot-fairness-"))
    wl = tmp / "workload.yaml"
    wl.write_text(yaml.safe_dump(workload(args.rate, args.duration)))
    # The light tenants first: the same seeds, so the same arrivals and prompts, in every phase.
    light = [f"{n}=sk-{n}" for n in LIGHT]
    heavy = f"heavy=sk-heavy*{args.heavy:g}"
    phases: dict[str, dict] = {}
    for one_tenant in (False, True):
        proc, base = serve(tmp / "keys.txt", one_tenant, args)
        try:
            if not one_tenant:
                phases["alone"] = bench(base, wl, light, tmp / "alone.json")
                phases["fair"] = bench(base, wl, [*light, heavy], tmp / "fair.json")
            else:
                phases["fifo"] = bench(base, wl, [*light, heavy], tmp / "fifo.json")
        finally:
            stop_server(proc)
    result = {
        "light_rate": args.rate,
        "heavy_multiple": args.heavy,
        "duration_s": args.duration,
        "max_num_seqs": args.max_num_seqs,
        "light": {phase: light_figures(runs) for phase, runs in phases.items()},
        "heavy": {
            p: {"sent": r["heavy"]["sent"], "ok": r["heavy"]["ok"]}
            for p, r in phases.items()
            if "heavy" in r
        },
    }
    worst = {
        phase: max(result["light"][phase][n]["ttft_p95_ms"] or 0.0 for n in LIGHT)
        for phase in phases
    }
    result["light_ttft_p95_over_alone"] = {
        phase: round(worst[phase] / worst["alone"], 2) if worst["alone"] else None
        for phase in ("fair", "fifo")
    }
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(
                "light tenants' TTFT p95 beside a 10x tenant, over alone",
                "x",
                result["light_ttft_p95_over_alone"]["fair"],
                result["light_ttft_p95_over_alone"]["fifo"],
            ),
            results.figure("light tenants' TTFT p95 alone", "ms", worst["alone"]),
        ]
        run.record(figures, "fairness off (every key one tenant: arrival order)", result)


if __name__ == "__main__":
    main()
