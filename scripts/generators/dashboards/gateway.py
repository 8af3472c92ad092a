"""The "kvpilot / Gateway" dashboard: requests by outcome, requests held while a model scales
from zero, routing between replicas, upstream latency."""

from grafana_foundation_sdk.builders import dashboard

from kvpilot_common import metric_names as names

from ..promql import GATEWAY, OPERATOR, OVERLOADED, UPSTREAM_ERRORS, increase, rate, sel
from .common import DATASOURCE, latency_panel, new_dashboard, panel, variables


def gateway() -> dashboard.Dashboard:
    gw = "sum by (model)"
    requests = rate(names.GATEWAY_REQUESTS, GATEWAY)
    routing = rate(names.GATEWAY_ROUTING, GATEWAY)
    holds = f"{names.GATEWAY_HOLD_SECONDS}_count"
    ready = sel(names.OPERATOR_READY_REPLICAS, OPERATOR)
    # Only the wakes from zero that held requests asked for, the gateway's part in scaling.
    demand = 'reason="Demand"'
    wakes = (
        f"sum by (namespace, name, direction, reason) "
        f"({increase(names.OPERATOR_SCALE_EVENTS, OPERATOR, extra=demand)})"
    )
    return (
        new_dashboard(
            "kvpilot-gateway",
            "kvpilot / Gateway",
            "The kvpilot gateway in front of the models: requests by outcome, requests held "
            "while a model scales from zero, routing between replicas, upstream latency.",
        )
        .variables(
            variables(
                names.GATEWAY_REQUESTS,
                "model",
                "The `model` label of gateway metrics (the ModelDeployment's name) and the "
                "`name` label of operator metrics",
                pods=False,
            )
        )
        .annotation(
            dashboard.AnnotationQuery()
            .name("Woken from zero")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("orange")
            .expr(f"{wakes} > 0")
        )
        .with_row(dashboard.Row("Requests"))
        .with_panel(
            panel(
                "Requests/s by outcome",
                "Requests the gateway finished per second. ok: the replica's answer was passed "
                "on (4xx and 5xx: the replica answered with that status class); "
                "upstream_error: no replica answered, or the stream broke; overloaded: 429, "
                "over the hold bound; starting: 503, held past the hold timeout; "
                "unavailable: 503, at zero with autoscaling off; client_closed: the client "
                "left first.",
                [(f"sum by (model, outcome) ({requests})", "{{model}} {{outcome}}")],
                unit="reqps",
            )
        )
        .with_panel(
            panel(
                "Upstream error ratio",
                'Share of the gateway\'s requests with outcome "upstream_error" or "5xx": no '
                "replica answered, a stream broke, or the replica answered 5xx "
                "(KvpilotGatewayUpstreamErrors).",
                [
                    (
                        f"({gw} ({rate(names.GATEWAY_REQUESTS, GATEWAY, extra=UPSTREAM_ERRORS)})"
                        f" or {gw} ({requests}) * 0) / {gw} ({requests})",
                        "{{model}}",
                    )
                ],
                unit="percentunit",
                ratio=True,
            )
        )
        .with_panel(
            panel(
                "In flight",
                "Requests being proxied to a replica now, summed over gateway replicas.",
                [(f"{gw} ({sel(names.GATEWAY_IN_FLIGHT, GATEWAY)})", "{{model}}")],
            )
        )
        .with_panel(
            panel(
                "Unrouted requests/s by reason",
                "Requests answered before a model was known (bad body, unknown model, no API "
                "key, the client left while sending): not per model, so the variables do not "
                "filter it.",
                [
                    (
                        f"sum by (reason) ({rate(names.GATEWAY_UNROUTED, '')})",
                        "{{reason}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_row(dashboard.Row("Scale from zero"))
        .with_panel(
            panel(
                "Held requests vs ready replicas",
                "Requests waiting at the gateways for a ready replica (summed over gateway "
                "replicas), and the ready replicas the operator counts.",
                [
                    (f"{gw} ({sel(names.GATEWAY_HELD, GATEWAY)})", "{{model}} held"),
                    (
                        f"max by (namespace, name) ({ready})",
                        "{{name}} ready replicas",
                    ),
                ],
                width=8,
            )
        )
        .with_panel(
            latency_panel(
                "Hold time",
                names.GATEWAY_HOLD_SECONDS,
                "How long requests were held before a replica was ready (or they timed out, or "
                "the client left), p50/p95/p99: the cold start as clients see it.",
                GATEWAY,
            )
        )
        .with_panel(
            panel(
                "Holds ended/s by outcome",
                "ready: sent to a replica; timeout: answered 503 after the hold timeout "
                "(KvpilotGatewayHoldTimeouts); client_closed: the client left while held.",
                [(f"sum by (model, outcome) ({rate(holds, GATEWAY)})", "{{model}} {{outcome}}")],
                unit="reqps",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Woken from zero",
                "Scale-ups from zero that held requests caused (the operator's scale events "
                'with reason "Demand"; also shown as annotations).',
                [(wakes, "{{name}}")],
                bars=True,
            )
        )
        .with_panel(
            panel(
                "Refused over the hold bound/s",
                "429s because too many requests were already held for the model or in all "
                "(KvpilotGatewayHoldsOverloaded).",
                [
                    (
                        f"{gw} ({rate(names.GATEWAY_REQUESTS, GATEWAY, extra=OVERLOADED)})"
                        f" or {gw} ({requests}) * 0",
                        "{{model}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_row(dashboard.Row("Routing and replicas"))
        .with_panel(
            latency_panel(
                "Upstream latency",
                names.GATEWAY_UPSTREAM_SECONDS,
                "From sending a request to a replica to its response headers (a stream: its "
                "first byte), p50/p95/p99.",
                GATEWAY,
            )
        )
        .with_panel(
            panel(
                "Routing decisions by reason",
                "Share of replica choices per reason: affinity (the replica that holds the "
                "conversation's prefix), overflow (that replica was over its bounded load), "
                "least-load, round-robin. Less affinity means fewer prefix cache hits.",
                [
                    (
                        f"sum by (model, reason) ({routing})"
                        f" / ignoring (reason) group_left sum by (model) ({routing})",
                        "{{model}} {{reason}}",
                    )
                ],
                unit="percentunit",
                width=8,
                ratio=True,
            )
        )
        .with_panel(
            panel(
                "Retries/s",
                "Requests sent again to another replica after one failed before answering "
                "(refused the connection, or answered 503 while draining).",
                [(f"{gw} ({rate(names.GATEWAY_RETRIES, GATEWAY)})", "{{model}}")],
                unit="reqps",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Stream resumes/s by reason",
                "Streams continued on another replica after theirs broke mid-stream: the "
                "connection failed (connection), it went silent (idle_timeout), it sent a "
                "server-side error event (error_event) or it closed before the end "
                "(ended_early). The client saw one uninterrupted stream.",
                [
                    (
                        f"sum by (model, reason) ({rate(names.GATEWAY_RESUMES, GATEWAY)})",
                        "{{model}} {{reason}}",
                    )
                ],
                unit="reqps",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Rate-limited requests/s by tenant",
                "Requests the gateway refused with 429 because their API key's tenant was past "
                "its requests (requests) or tokens (tokens) per minute, from the key file.",
                [
                    (
                        f"sum by (tenant, limit) ({rate(names.GATEWAY_RATE_LIMITED, '')})",
                        "{{tenant}} {{limit}}",
                    )
                ],
                unit="reqps",
                width=8,
            )
        )
    )
