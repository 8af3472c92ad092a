"""`kvpilot bench`'s flags. Standard library only: `kvpilot --help` builds every subcommand's
parser in an install without the bench extra; the work is in command.py."""

import argparse

from kvpilot_bench import tenants


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        required=True,
        help="the server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)",
    )
    parser.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY if set)")
    parser.add_argument("--model", help="model name to request (default: the first /v1/models)")
    parser.add_argument(
        "--workload",
        default="mixed",
        help="a workload YAML file or a preset: chat, summarize, mixed, structured (default mixed)",
    )
    parser.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s")
    parser.add_argument("--duration", type=float, help="seconds of arrivals (default: workload's)")
    parser.add_argument("--requests", type=int, help="at most this many requests")
    parser.add_argument("--seed", type=int, help="seed for arrivals, lengths and prompts")
    parser.add_argument(
        "--prompts",
        help='a JSONL file of prompts, one {"prompt": ...} or {"messages": [...]} per line '
        "(default: prose from Python's own documentation, read on this machine)",
    )
    parser.add_argument(
        "--tokenizer",
        help="tokenizer.json (or its directory) to count tokens with when the server has no "
        "/tokenize (default: its /tokenize, else an estimate of 1.3 tokens per word)",
    )
    parser.add_argument("--slo-ttft-ms", type=float, help="time-to-first-token SLO for goodput")
    parser.add_argument("--slo-e2e-ms", type=float, help="end-to-end latency SLO for goodput")
    parser.add_argument("--json-out", help="write the report as JSON (report.schema.json)")
    parser.add_argument("--plot-out", help="write PNG plots here")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=512,
        help="connections open at once; later requests wait in the client, and that wait "
        "counts in their latency",
    )
    parser.add_argument("--label", help="name of --url's server in reports")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-server-metrics",
        action="store_true",
        help="do not read the server's /metrics during the run",
    )
    parser.add_argument(
        "--tenant",
        action="append",
        type=tenants.parse,
        default=[],
        metavar="NAME=KEY[*SCALE]",
        help="a tenant sending the workload with its own API key, at SCALE times the rate "
        "(repeat: the tenants send at once, and each one's latency is reported)",
    )
    compare = parser.add_argument_group(
        "compare", "the same requests against a second server, after the first"
    )
    compare.add_argument("--compare", metavar="URL", help="the second server's base URL")
    compare.add_argument("--compare-api-key")
    compare.add_argument("--compare-model", help="default: the first of its /v1/models")
    compare.add_argument("--compare-label", help="its name in reports")
    sweep = parser.add_argument_group(
        "sweep",
        "raise the rate until the SLO breaks (needs --slo-ttft-ms or --slo-e2e-ms); report "
        "the rate one replica sustains and autoscaling targets for a ModelDeployment",
    )
    sweep.add_argument("--sweep", action="store_true")
    sweep.add_argument("--sweep-start", type=float, default=0.5, help="first rate, requests/s")
    sweep.add_argument("--sweep-factor", type=float, default=1.5, help="rate multiplier per step")
    sweep.add_argument("--sweep-max-rate", type=float, default=1000.0)
    sweep.add_argument("--sweep-steps", type=int, default=8, help="at most this many steps up")
    sweep.add_argument(
        "--sweep-refine", type=int, default=2, help="bisections after the first failed step"
    )
    sweep.add_argument(
        "--sweep-step-duration", type=float, default=30.0, help="seconds of arrivals per step"
    )
    sweep.add_argument(
        "--goodput-target",
        type=float,
        default=0.95,
        help="share of requests within the SLO for a step to pass (default 0.95)",
    )


def run_bench(args: argparse.Namespace) -> int:
    from kvpilot_bench.command import main

    return main(args)
