"""The autoscaler's decisions on simulated traffic: per trace, the share of one-minute windows
whose p95 met the target, the replica-seconds used against an oracle's, and direction reversals,
sized from demand (kvpilot) beside scaling on latency and queue ratios alone (the baseline, as
the HPA and kvpilot before it did), in one run. Prints JSON.

The service is kvpilot_testing/autoscale_sim.py's: M/M/1 replicas that take 60 s to start, four
hours of each trace (diurnal with bursts, a steep ramp with ripple, a sawtooth, bursts of 30 s
to 10 minutes, a noisy plateau, a slow decline), the first half hour not counted. It runs in
seconds: the figures depend on the code alone, not the machine.
"""

import argparse
import json

from kvpilot_testing import results
from kvpilot_testing.autoscale_sim import TRACES, simulate

FIGURES = (
    ("windows_within_target", "share of windows"),
    ("replica_seconds_vs_oracle", "x the oracle"),
    ("direction_reversals", "reversals"),
)


def main() -> None:
    run = results.Run.start("autoscaling")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results.add_argument(parser)
    args = parser.parse_args()
    report: dict = {}
    for name, trace in TRACES.items():
        demand, ratios = simulate(trace), simulate(trace, demand=False)
        for figures in (demand, ratios):
            figures.pop("windows_over_target_at_s")
        report[name] = {"kvpilot": demand, "ratios_only": ratios}
    print(json.dumps(report, indent=2))
    if args.record:
        rows = [
            results.figure(
                f"{name}: {key.replace('_', ' ')}",
                unit,
                both["kvpilot"][key],
                both["ratios_only"][key],
            )
            for name, both in report.items()
            for key, unit in FIGURES
        ]
        run.record(rows, "scaling on latency and queue ratios alone", report)


if __name__ == "__main__":
    main()
