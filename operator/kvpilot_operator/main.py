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
    parser.add_argument(
        "--peering",
        default="",
        metavar="NAME",
        help="run as one of several replicas, with kopf's peering object NAME (a KopfPeering "
        "in each watched namespace; a ClusterKopfPeering watching all): the oldest replica "
        "acts, the others wait (default: standalone, one replica)",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        metavar="SECONDS",
        help="with --peering: how long a replica's keep-alive counts, so how long a replica "
        "that died without a clean exit holds the others back",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run_operator(args: argparse.Namespace) -> int:
    import kopf

    import kvpilot_operator.autoscaler
    import kvpilot_operator.handlers
    import kvpilot_operator.wake  # noqa: F401 - registers the handlers
    from kvpilot_operator import peering

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    if not args.verbose:  # one line per API call is debugging detail
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    common: dict = {
        "clusterwide": not args.namespace,
        "namespaces": args.namespace,
        "liveness_endpoint": args.liveness or None,
    }
    if not args.peering:  # one replica (the chart's default, strategy Recreate)
        kopf.run(standalone=True, **common)
        return 0
    # Several: kopf's peering, made mandatory by naming the object (it pauses until it has
    # seen the peers), each replica's priority its start time (peering.py).
    kopf.run(
        peering_name=args.peering,
        priority=peering.priority(),
        settings=peering.settings(args.peering_lifetime),
        memo=kopf.Memo({peering.MEMO_KEY: list(args.namespace)}),
        **common,
    )
    return 0
