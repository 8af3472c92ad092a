"""`--tenant NAME=KEY[*SCALE]`: several tenants (API keys) send the workload at once, each at
its own multiple of the rate, and each tenant's latency is reported on its own: what a heavy
tenant does to light ones, and what a server's fairness and limits do about it. Standard
library at import: cli.py's --tenant parses with it in an install without the bench extra."""

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpilot_bench.workload import Workload


@dataclass(frozen=True)
class TenantSpec:
    name: str
    key: str
    scale: float = 1.0  # times the workload's rate


def parse(value: str) -> TenantSpec:
    """argparse's type for --tenant."""
    name, sep, rest = value.partition("=")
    key, star, scale = rest.rpartition("*") if "*" in rest else (rest, "", "")
    if not sep or not name or not key:
        raise argparse.ArgumentTypeError(f"{value!r}: NAME=KEY or NAME=KEY*SCALE")
    try:
        factor = float(scale) if star else 1.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: SCALE is a number") from None
    if factor <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: SCALE must be positive")
    return TenantSpec(name, key, factor)


def workload_for(workload: "Workload", tenant: TenantSpec, index: int) -> "Workload":
    """The tenant's own arrivals and prompts (seed + index), at its multiple of the rate."""
    own = workload.with_limits(seed=workload.seed + index)
    if tenant.scale == 1.0:
        return own
    rate = own.arrival.params.get("rate")
    if own.arrival.process != "poisson" or rate is None:
        raise ValueError(
            f"--tenant {tenant.name}: a SCALE needs Poisson arrivals with a rate (pass --rate)"
        )
    return own.with_rate(rate * tenant.scale)


def summary(reports: list[dict]) -> str:
    """A row per tenant: what it sent, got and waited."""
    from kvpilot_bench.report import align

    def ms(p: dict | None, q: int) -> str:
        return "-" if p is None else f"{p[f'p{q}']:.1f}"

    table: list[tuple[str, ...]] = [
        ("tenant", "sent", "ok", "errors", "TTFT p50", "TTFT p95", "E2E p95", "out tok/s")
    ]
    for r in reports:
        t = r["totals"]
        table.append(
            (
                r["label"],
                str(t["sent"]),
                str(t["ok"]),
                str(sum(t["errors"].values())),
                ms(t["ttft_ms"], 50),
                ms(t["ttft_ms"], 95),
                ms(t["e2e_ms"], 95),
                f"{t['output_tokens_per_s']:.1f}",
            )
        )
    return "\n".join(align(table))
