"""PNG plots with matplotlib's Agg backend (no display needed).

A run (or the runs of a comparison, one line style per endpoint): the latency CDFs per class
(time to first token, end to end), throughput and requests in flight over time. A sweep: p95
latencies and goodput against the offered rate, with the SLO and the sustainable rate marked.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from kvpilot_bench.runner import RunResult

_STYLES = ("-", "--", ":", "-.")
_DPI = 80


def _cdf(ax: Axes, seconds: list[float], color: str, style: str, label: str) -> None:
    if not seconds:
        return
    values = np.sort(np.asarray(seconds)) * 1000.0
    ax.step(
        values,
        np.arange(1, len(values) + 1) / len(values),
        where="post",
        color=color,
        linestyle=style,
        label=f"{label} (n={len(values)})",
    )


def _span(ax: Axes) -> tuple[float, float]:
    xs = [x for line in ax.lines for x in np.atleast_1d(line.get_xdata()) if np.isfinite(x)]
    return (min(xs), max(xs)) if xs else (0.0, 0.0)


def plot_runs(results: list[RunResult], reports: list[dict], path: str) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (ttft_ax, e2e_ax), (tput_ax, flight_ax) = axes
    names = [c.name for c in results[0].workload.classes]
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    many = len(results) > 1
    for k, (result, report) in enumerate(zip(results, reports, strict=True)):
        style, who = _STYLES[k % len(_STYLES)], (result.endpoint.label or result.endpoint.root)
        for name in names:
            recs = [r for r in result.records if r.cls == name]
            label = f"{who}: {name}" if many else name
            ttfts = [r.ttft for r in recs if r.stream and r.ttft is not None]
            _cdf(ttft_ax, ttfts, colors[name], style, label)
            e2es = [r.e2e for r in recs if r.outcome == "ok" and r.e2e is not None]
            _cdf(e2e_ax, e2es, colors[name], style, label)
        line = report["timeline"]
        t = np.asarray(line["t"]) + line["bin_s"] / 2
        tput_ax.plot(
            t,
            line["output_tokens_per_s"],
            color="C0",
            linestyle=style,
            label=f"{who} output tok/s" if many else "output tok/s",
        )
        flight_ax.plot(
            t,
            line["in_flight"],
            color="C3",
            linestyle=style,
            label=f"{who} in flight" if many else "in flight",
        )
        flight_ax.plot(
            t,
            line["completed_per_s"],
            color="C2",
            linestyle=style,
            label=f"{who} completed/s" if many else "completed/s",
        )
    slo = reports[0]["slo"]
    for ax, title, limit in (
        (ttft_ax, "Time to first token (streamed requests)", slo["ttft_ms"]),
        (e2e_ax, "End-to-end latency (completed requests)", slo["e2e_ms"]),
    ):
        if limit is not None:
            ax.axvline(limit, color="grey", linestyle=":", label=f"SLO {limit:g} ms")
        ax.set(title=title, xlabel="ms", ylabel="share of requests", ylim=(0, 1.02))
        low, high = _span(ax)
        if low > 0 and high / low > 50:  # tails a decade or more away: a log axis shows both
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="lower right")
    tput_ax.set(title="Output throughput", xlabel="s since start", ylabel="tokens/s")
    flight_ax.set(
        title="Requests in flight and completed", xlabel="s since start", ylabel="requests"
    )
    for ax in (tput_ax, flight_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    first = reports[0]
    fig.suptitle(
        f"kvpilot bench: {first['workload']['name']} against "
        + " vs ".join(r.endpoint.label or r.endpoint.model for r in results)
    )
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_sweep(sweep: dict, reports: list[dict], path: str) -> None:
    fig, (lat_ax, good_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = [s["rate"] for s in sweep["steps"]]
    order = np.argsort(rates)
    r = np.asarray(rates)[order]

    def series(key: str) -> np.ndarray:
        values = [(rep["totals"][key] or {}).get("p95", np.nan) for rep in reports]
        return np.asarray(values, dtype=float)[order]

    lat_ax.plot(r, series("ttft_ms"), "o-", label="p95 TTFT")
    lat_ax.plot(r, series("e2e_ms"), "s-", label="p95 E2E")
    if all(rep["server"] for rep in reports):  # what the autoscaler would have seen
        seen = [rep["server"]["p95_ttft_ms"] for rep in reports]
        seen_p95 = np.asarray([np.nan if v is None else v for v in seen], dtype=float)[order]
        lat_ax.plot(r, seen_p95, "o--", color="C0", alpha=0.6, label="p95 TTFT, server buckets")
    slo = reports[0]["slo"]
    for value, name in ((slo["ttft_ms"], "TTFT SLO"), (slo["e2e_ms"], "E2E SLO")):
        if value is not None:
            lat_ax.axhline(value, linestyle=":", color="grey", label=name)
    shares = [rep["totals"]["goodput"]["share"] for rep in reports]
    good = np.asarray([np.nan if s is None else s for s in shares], dtype=float)[order]
    good_ax.plot(r, 100 * good, "o-", color="C2", label="goodput")
    good_ax.axhline(100 * sweep["goodput_target"], linestyle=":", color="grey", label="target")
    if sweep["sustainable_rate"] is not None:
        for ax in (lat_ax, good_ax):
            ax.axvline(sweep["sustainable_rate"], color="C3", alpha=0.5, label="sustainable")
    lat_ax.set(title="p95 latency by offered rate", xlabel="requests/s", ylabel="ms")
    lat_ax.set_yscale("log")  # TTFT and E2E are often a decade or more apart
    good_ax.set(
        title="Goodput by offered rate", xlabel="requests/s", ylabel="% within SLO", ylim=(0, 102)
    )
    for ax in (lat_ax, good_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
