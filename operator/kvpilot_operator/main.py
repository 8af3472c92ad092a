"""`kvpilot operator`: run the kopf operator (handlers in kvpilot_operator.handlers)."""

import argparse
import logging


def add_operator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="URL the liveness endpoint listens on (empty to disable)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="port of the operator's own /metrics (0 to disable)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run_operator(args: argparse.Namespace) -> int:
    import kopf

    import kvpilot_operator.autoscaler
    import kvpilot_operator.handlers
    import kvpilot_operator.wake  # noqa: F401 - registers the handlers

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    if not args.verbose:  # one line per API call is debugging detail
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    # One operator replica (the chart runs one, strategy Recreate): no peering needed.
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0
