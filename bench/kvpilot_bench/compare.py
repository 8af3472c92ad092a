"""Compare: the same plan (same seed, same prompts, same arrival times) against two endpoints,
one after the other so that they never compete for the machine, reported side by side."""

from kvpilot_bench.report import align


def _cell(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if unit == "%" else f"{value:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def rows(report: dict, name: str) -> list[tuple[str, float | None, str]]:
    s = report["totals"] if name == "all" else report["classes"][name]
    out: list[tuple[str, float | None, str]] = [
        (f"{name} completed/s", s["requests_per_s"], ""),
        (f"{name} output tok/s", s["output_tokens_per_s"], ""),
        (f"{name} goodput", s["goodput"]["share"], "%"),
        (f"{name} errors", float(sum(s["errors"].values())), ""),
    ]
    if "structured" in s:  # a workload with structured requests: both runs have it
        out.append((f"{name} valid share", s["structured"]["valid_share"], "%"))
    for label, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")):
        for q in (50, 95, 99):
            p = s[key]
            out.append((f"{name} {label} p{q} ms", None if p is None else p[f"p{q}"], ""))
    return out


def side_by_side(reports: list[dict]) -> str:
    """One row per figure, one column per endpoint, and the second's ratio to the first."""
    labels = [r["label"] or r["url"] for r in reports]
    table = [("", *labels, f"{labels[1]} / {labels[0]}")]
    classes = list(reports[0]["classes"])
    names = [*classes, "all"] if len(classes) > 1 else classes  # one class: its rows are all
    for name in names:
        a, b = rows(reports[0], name), rows(reports[1], name)
        for (what, va, unit), (_, vb, _) in zip(a, b, strict=True):
            if va is None and vb is None:
                continue
            table.append((what, _cell(va, unit), _cell(vb, unit), _ratio(va, vb)))
    return "\n".join(align(table))
