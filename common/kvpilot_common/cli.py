"""The `kvpilot` command: a table of subcommands, each the side that runs it. A subcommand's
flags and its run function are named as "module:function" and imported only when needed, so
this package never imports a side, and a command whose extra is missing says which in one line
instead of an ImportError's traceback."""

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from kvpilot_common.extras import missing_extra


@dataclass(frozen=True)
class Command:
    name: str
    extra: str | None  # the pyproject extra it needs; None: the base install runs it
    flags: str  # "module:function" adding its arguments (standard library only)
    run: str  # "module:function" taking the parsed arguments, returning the exit code
    help: str
    description: str


COMMANDS = (
    Command(
        "generate",
        "server",
        "kvpilot_server.commands:add_generate_args",
        "kvpilot_server.generate:run_generate",
        "offline batch generation: prompts in, JSONL out",
        "Generate completions offline. Each prompt is a string argument, or a line of a JSONL "
        'file: {"prompt": "..."} or {"messages": [...]} (chat template applied), with optional '
        "per-line max_tokens/temperature/top_p/seed/stop. One JSON result per line.",
    ),
    Command(
        "serve",
        "server",
        "kvpilot_server.commands:add_serve_args",
        "kvpilot_server.serve:run_serve",
        "serve the OpenAI-compatible API",
        "Serve /v1/chat/completions, /v1/completions and /v1/models over HTTP.",
    ),
    Command(
        "plan",
        None,
        "kvpilot_server.plan:add_plan_args",
        "kvpilot_server.plan:run_plan",
        "will a model fit on a device, and how many sequences fit its KV cache",
        "The memory model without loading anything: weight bytes by dtype and quantization, KV "
        "bytes per token, the cache left after weights and runtime headroom, and how many "
        "max-length sequences it holds. Exit code 1 when it does not fit.",
    ),
    Command(
        "eval",
        "server",
        "kvpilot_server.evaluate:add_eval_args",
        "kvpilot_server.evaluate:run_eval",
        "measure what quantization costs: perplexity, agreement, speed, memory",
        "Compare weight and KV cache precisions on one model, each config in a fresh process: "
        "perplexity on held-out text, greedy agreement with the unquantized model, tokens/s at "
        "batch 1 and 32, peak resident memory. Prints a table or JSON.",
    ),
    Command(
        "operator",
        "operator",
        "kvpilot_operator.main:add_operator_args",
        "kvpilot_operator.main:run_operator",
        "run the Kubernetes operator for ModelDeployments",
        "Reconcile ModelDeployments (kvpilot.dev/v1alpha1) into Deployments, Services and "
        "PodDisruptionBudgets, and report their status. Uses the in-cluster service account or "
        "$KUBECONFIG.",
    ),
    Command(
        "gateway",
        "gateway",
        "kvpilot_gateway.options:add_gateway_args",
        "kvpilot_gateway.main:run_gateway",
        "one OpenAI-compatible endpoint for every ModelDeployment: routing by model, load and "
        "prefix, requests held while a model scales from zero",
        "Serve /v1/chat/completions, /v1/completions and /v1/models for the ModelDeployments "
        "it watches, routing each request by its `model` to a ready replica (by load and prompt "
        "prefix) and streaming the answer through. A model with no ready replica holds its "
        "requests and asks the operator to scale it up. Uses the in-cluster service account or "
        "$KUBECONFIG; without Kubernetes, --backend MODEL=URL names the servers instead. See "
        "docs/gateway.md.",
    ),
    Command(
        "bench",
        "bench",
        "kvpilot_bench.cli:add_bench_args",
        "kvpilot_bench.cli:run_bench",
        "capacity test of any OpenAI-compatible server: latency percentiles, goodput, plots, "
        "the rate one replica sustains and autoscaling targets",
        "Send a mixed workload (request classes with length distributions, streaming, "
        "cancellations and service tiers under an arrival process) to an OpenAI-compatible "
        "server (kvpilot, vLLM, TGI, llama.cpp) and report TTFT, inter-token and end-to-end "
        "percentiles per class, throughput, goodput against an SLO and errors by kind, as "
        "tables, JSON and PNG plots. --sweep raises the rate until the SLO breaks and "
        "recommends a ModelDeployment's autoscaling targets; --compare runs the same requests "
        "against a second server. See docs/bench.md.",
    ),
)
BY_NAME = {c.name: c for c in COMMANDS}
DESCRIPTION = (
    "The `kvpilot` command. Subcommands import their heavy dependencies only when they run."
)


def resolve(target: str) -> Callable[..., Any]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and flag; the operator's rendered pod args are checked against it."""
    parser = argparse.ArgumentParser(prog="kvpilot", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.description)
        resolve(command.flags)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = BY_NAME[args.command]
    missing = missing_extra(command.name, command.extra)
    if missing:  # one line naming the extra to install, not an ImportError's traceback
        print(missing, file=sys.stderr)
        return 1
    return resolve(command.run)(args)


def program() -> NoReturn:
    """The `kvpilot` executable: main(), with SIGTERM ending the process from its first line
    until a command puts its own handler in (uvicorn's drain, kopf's stop). In a container the
    command is PID 1, for which the kernel has no default action: without a handler a pod
    deleted or scaled down while it loads its model ignores SIGTERM and runs on until the end of
    its grace period, then is killed."""
    signal.signal(signal.SIGTERM, _exit_at_once)
    sys.exit(main())


def _exit_at_once(signum: int, frame: FrameType | None) -> None:
    # Nothing is served yet, so there is nothing to drain; 128 + the signal is the code a shell
    # reports for a process the signal's default action ended.
    print(f"kvpilot: {signal.Signals(signum).name} before serving: exiting", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)


if __name__ == "__main__":
    program()
