"""The report: a JSON document for machines (valid against report.schema.json, shipped beside
this module) and text tables for people. A workload with structured requests adds `structured`
figures to the totals, to its structured classes and to each structured request; others' reports
are unchanged."""

import json
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

from kvpilot_bench import stats
from kvpilot_bench.client import Record
from kvpilot_bench.runner import RunResult

SCHEMA_PATH = Path(__file__).parent / "report.schema.json"
SCHEMA_ID = "kvpilot-bench-report/v1"
LATENCIES = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


@cache
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def validate(document: dict) -> None:
    jsonschema.validate(document, schema())


def run_report(result: RunResult, slo: stats.Slo, bin_s: float | None = None) -> dict:
    """bin_s: the timeline's resolution (default: 1 s, coarser to keep about 60 bins)."""
    records, duration, workload = result.records, result.duration_s, result.workload
    bin_s = bin_s or max(1.0, float(round(duration / 60)))
    lags = np.array([r.lag for r in records]) * 1000.0 if records else np.zeros(1)
    doc: dict[str, Any] = {
        "label": result.endpoint.label,
        "url": result.endpoint.root,
        "model": result.endpoint.model,
        "workload": {
            "name": workload.name,
            "seed": workload.seed,
            "duration_s": workload.duration_s,
            "max_requests": workload.max_requests,
            "arrival": {"process": workload.arrival.process, **workload.arrival.params},
            "classes": [c.name for c in workload.classes],
        },
        "started_at": result.started_at,
        "duration_s": duration,
        "interrupted": result.interrupted,
        "token_counter": result.token_counter,
        "planned": result.planned,
        "clamped": result.clamped,
        "load_generator": {
            "lag_p99_ms": float(np.percentile(lags, 99)),
            "lag_max_ms": float(lags.max()),
        },
        "slo": {"ttft_ms": slo.ttft_ms, "e2e_ms": slo.e2e_ms},
        "totals": stats.summarize(records, duration, slo),
        "classes": {
            c.name: stats.summarize([r for r in records if r.cls == c.name], duration, slo)
            for c in workload.classes
        },
        "server": result.server,
        "timeline": stats.timeline(records, duration, bin_s),
        "requests": [_request(r) for r in records],
    }
    structured = [c.name for c in workload.classes if c.structured]
    if structured:
        doc["totals"]["structured"] = stats.structured(records)
        for name in structured:
            mine = [r for r in records if r.cls == name]
            doc["classes"][name]["structured"] = stats.structured(mine)
    return doc


def _request(rec: Record) -> dict:
    """One request as measured (inter-token gaps summarized: the report's ITL has them all)."""
    out = {
        "index": rec.index,
        "class": rec.cls,
        "stream": rec.stream,
        "sent_at_s": rec.sent_at,
        "outcome": rec.outcome,
        "status": rec.status,
        "ttft_ms": _ms(rec.ttft),
        "e2e_ms": _ms(rec.e2e),
        "itl_mean_ms": _ms(sum(rec.itl) / len(rec.itl)) if rec.itl else None,
        "tokens_in": rec.tokens_in,
        "tokens_out": rec.tokens_out,
        "clamped": rec.clamped,
        "error": rec.error,
    }
    if rec.variant is not None:
        out["structured"] = {
            "variant": rec.variant,
            "valid": rec.valid,
            "failure": rec.failure,
            "detail": rec.failure_detail,
        }
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def document(mode: str, runs: list[dict], sweep: dict | None = None) -> dict:
    try:
        version = metadata.version("kvpilot")
    except metadata.PackageNotFoundError:
        version = "unknown"
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "kvpilot_version": version,
        "mode": mode,
        "runs": runs,
    }
    doc["sweep"] = sweep
    return doc


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _errors(summary: dict) -> str:
    parts = [f"{k} {n}" for k, n in summary["errors"].items() if n]
    return ", ".join(parts) or "-"


def one_line(report: dict) -> str:
    """A run in one line: what a sweep prints per step."""
    t = report["totals"]
    p95 = {key: (t[key] or {}).get("p95") for key in ("ttft_ms", "e2e_ms")}
    valid = f", valid {_share(t['structured']['valid_share'])}" if "structured" in t else ""
    return (
        f"sent {t['sent']}, ok {t['ok']}, goodput {_share(t['goodput']['share'])}, "
        f"p95 TTFT {_f(p95['ttft_ms'])} ms, p95 E2E {_f(p95['e2e_ms'])} ms, "
        f"errors: {_errors(t)}{valid}"
    )


def table(report: dict) -> str:
    """Counts and throughput per class, then latency percentiles per class."""
    w, slo = report["workload"], report["slo"]
    head = (
        f"{w['name']} against {report['url']} ({report['model']}): "
        f"{report['duration_s']:.1f} s, {report['totals']['sent']} of {report['planned']} "
        f"planned requests sent" + (" (interrupted)" if report["interrupted"] else "")
    )
    slo_text = ", ".join(
        f"{name} <= {value:g} ms"
        for name, value in (("TTFT", slo["ttft_ms"]), ("E2E", slo["e2e_ms"]))
        if value is not None
    )
    lines = [head, f"goodput: requests completing with {slo_text or 'no error (no SLO given)'}"]
    head_row = ("class", "sent", "ok", "cancelled", "req/s", "out tok/s", "goodput", "errors")
    rows: list[tuple[str, ...]] = [head_row]
    for name, s in [*report["classes"].items(), ("all", report["totals"])]:
        rows.append(
            (
                name,
                str(s["sent"]),
                str(s["ok"]),
                str(s["cancelled"]),
                _f(s["requests_per_s"], 2),
                _f(s["output_tokens_per_s"], 1),
                _share(s["goodput"]["share"]),
                _errors(s),
            )
        )
    lines += ["", *align(rows, text_last=True)]
    rows = [("latency (ms)", "p50", "p90", "p95", "p99", "max", "n")]
    for name, s in report["classes"].items():
        for label, key in LATENCIES:
            p = s[key]
            if p is None:
                continue
            rows.append(
                (
                    f"{name} {label}",
                    *(_f(p[f"p{q}"]) for q in stats.PERCENTILES),
                    _f(p["max"]),
                    str(p["count"]),
                )
            )
    lines += ["", *align(rows)]
    lines += structured_table(report)
    server = report["server"]
    if server:
        outcomes = ", ".join(f"{k} {v}" for k, v in server["outcomes"].items()) or "none"
        lines += [
            "",
            f"server /metrics: queue {_f(server['queue_per_replica'], 2)}/replica, "
            f"p95 TTFT {_f(server['p95_ttft_ms'])} ms, p95 E2E {_f(server['p95_e2e_ms'])} ms "
            f"(histogram buckets, as the autoscaler reads them); finished by outcome: {outcomes}",
        ]
    if report["load_generator"]["lag_p99_ms"] > 50:
        lines.append(
            f"warning: the load generator sent requests late (p99 "
            f"{report['load_generator']['lag_p99_ms']:.0f} ms): the client machine is saturated"
        )
    return "\n".join(lines)


def structured_table(report: dict) -> list[str]:
    """Structured answers checked, valid and failed by kind, per structured class and in all
    (no lines for a workload without structured requests)."""
    if "structured" not in report["totals"]:
        return []
    rows: list[tuple[str, ...]] = [("structured", "checked", "valid", "valid share", "failures")]
    named = [(n, s) for n, s in report["classes"].items() if "structured" in s]
    for name, s in [*named, ("all", report["totals"])]:
        st = s["structured"]
        failures = ", ".join(f"{k} {n}" for k, n in st["failures"].items() if n) or "-"
        rows.append(
            (name, str(st["checked"]), str(st["valid"]), _share(st["valid_share"]), failures)
        )
    return ["", *align(rows, text_last=True)]


def align(rows: list[tuple[str, ...]], text_last: bool = False) -> list[str]:
    """The first column (and with text_last the last) left-aligned, numbers right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [c.rjust(w) for c, w in zip(row, widths, strict=True)]
        cells[0] = row[0].ljust(widths[0])
        if text_last:
            cells[-1] = row[-1]
        out.append("  ".join(cells).rstrip())
    return out
