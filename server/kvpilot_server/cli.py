"""The `kvpilot` command. Subcommands import their heavy dependencies only when they run."""

import argparse
import sys

from kvpilot_server.engine_args import add_engine_args
from kvpilot_server.extras import missing_extra
from kvpilot_server.http_limits import add_http_limit_args


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and flag; the operator's rendered pod args are checked against it."""
    parser = argparse.ArgumentParser(prog="kvpilot", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser(
        "generate",
        help="offline batch generation: prompts in, JSONL out",
        description="Generate completions offline. Each prompt is a string argument, or a line "
        'of a JSONL file: {"prompt": "..."} or {"messages": [...]} (chat template applied), with '
        "optional per-line max_tokens/temperature/top_p/seed/stop. One JSON result per line.",
    )
    generate.add_argument("prompts", nargs="*", help="prompt strings")
    generate.add_argument("--input", "-i", help="JSONL file of requests ('-' for stdin)")
    generate.add_argument("--output", "-o", help="JSONL file for results (default stdout)")
    generate.add_argument("--chat", action="store_true", help="apply the chat template to prompts")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    add_engine_args(generate)

    serve = commands.add_parser(
        "serve",
        help="serve the OpenAI-compatible API",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models over HTTP.",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="model name clients use (default: --model)")
    serve.add_argument(
        "--api-key-file",
        help="file of API keys, one per line (also: "
        "KVPILOT_API_KEYS=key1,key2); /health, /ready and /metrics stay open",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests allowed to wait for the engine; more get 429 + Retry-After",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds before a request is aborted with 408; a ceiling: a request's own "
        "timeout may shorten it, never extend it",
    )
    add_http_limit_args(serve)
    serve.add_argument(
        "--context-overflow",
        choices=["reject", "truncate-oldest"],
        default="reject",
        help="a chat longer than the context: reject with 400, or drop the oldest non-system "
        "turns until it fits (response header X-KVPilot-Dropped-Messages says how many)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to let in-flight requests finish after SIGTERM",
    )
    add_engine_args(serve)

    plan = commands.add_parser(
        "plan",
        help="will a model fit on a device, and how many sequences fit its KV cache",
        description="The memory model without loading anything: weight bytes by dtype and "
        "quantization, KV bytes per token, the cache left after weights and runtime headroom, "
        "and how many max-length sequences it holds. Exit code 1 when it does not fit.",
    )
    from kvpilot_server.plan import add_plan_args

    add_plan_args(plan)

    evaluate = commands.add_parser(
        "eval",
        help="measure what quantization costs: perplexity, agreement, speed, memory",
        description="Compare weight and KV cache precisions on one model, each config in a "
        "fresh process: perplexity on held-out text, greedy agreement with the unquantized "
        "model, tokens/s at batch 1 and 32, peak resident memory. Prints a table or JSON.",
    )
    from kvpilot_server.evaluate import add_eval_args

    add_eval_args(evaluate)

    operator = commands.add_parser(
        "operator",
        help="run the Kubernetes operator for ModelDeployments",
        description="Reconcile ModelDeployments (kvpilot.dev/v1alpha1) into Deployments, "
        "Services and PodDisruptionBudgets, and report their status. Uses the in-cluster "
        "service account or $KUBECONFIG.",
    )
    from kvpilot_operator.main import add_operator_args

    add_operator_args(operator)

    gateway = commands.add_parser(
        "gateway",
        help="one OpenAI-compatible endpoint for every ModelDeployment: routing by model, "
        "load and prefix, requests held while a model scales from zero",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models for the "
        "ModelDeployments it watches, routing each request by its `model` to a ready replica "
        "(by load and prompt prefix) and streaming the answer through. A model with no ready "
        "replica holds its requests and asks the operator to scale it up. Uses the in-cluster "
        "service account or $KUBECONFIG. See docs/gateway.md.",
    )
    from kvpilot_gateway.options import add_gateway_args

    add_gateway_args(gateway)

    bench = commands.add_parser(
        "bench",
        help="capacity test of any OpenAI-compatible server: latency percentiles, goodput, "
        "plots, the rate one replica sustains and autoscaling targets",
        description="Send a mixed workload (request classes with length distributions, "
        "streaming, cancellations and service tiers under an arrival process) to an "
        "OpenAI-compatible server (kvpilot, vLLM, TGI, llama.cpp) and report TTFT, inter-token "
        "and end-to-end percentiles per class, throughput, goodput against an SLO and errors by "
        "kind, as tables, JSON and PNG plots. --sweep raises the rate until the SLO breaks and "
        "recommends a ModelDeployment's autoscaling targets; --compare runs the same requests "
        "against a second server. See docs/bench.md.",
    )
    from kvpilot_server.bench.cli import add_bench_args

    add_bench_args(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    missing = missing_extra(args.command)
    if missing:  # one line naming the extra to install, not an ImportError's traceback
        print(missing, file=sys.stderr)
        return 1
    if args.command == "serve":
        from kvpilot_server.serve import run_serve

        return run_serve(args)
    if args.command == "plan":
        from kvpilot_server.plan import run_plan

        return run_plan(args)
    if args.command == "operator":
        from kvpilot_operator.main import run_operator

        return run_operator(args)
    if args.command == "eval":
        from kvpilot_server.evaluate import run_eval

        return run_eval(args)
    if args.command == "gateway":
        from kvpilot_gateway.main import run_gateway

        return run_gateway(args)
    if args.command == "bench":
        from kvpilot_server.bench.cli import run_bench

        return run_bench(args)
    if args.command == "generate":
        from kvpilot_server.generate import run_generate

        return run_generate(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
