"""The "kvpilot / Autoscaling and fleet" dashboard: the operator's view of replicas, what the
autoscaler observes and decides, reconciles and scrapes."""

from grafana_foundation_sdk.builders import dashboard

from kvpilot_common import metric_names as names

from ..promql import ENGINE, OPERATOR, QUANTILES, increase, quantile, rate, sel
from .common import DATASOURCE, new_dashboard, panel, variables


def fleet() -> dashboard.Dashboard:
    by = "namespace, name"
    reconciles = f"{names.OPERATOR_RECONCILE_SECONDS}_count"
    scale_events = (
        f"sum by (namespace, name, direction, reason) "
        f"({increase(names.OPERATOR_SCALE_EVENTS, OPERATOR)})"
    )
    interactive = f'class="{names.CLASS_INTERACTIVE}"'
    built = (
        new_dashboard(
            "kvpilot-fleet",
            "kvpilot / Autoscaling and fleet",
            "The kvpilot operator's view: replicas per ModelDeployment, what the autoscaler "
            "observes and decides, reconciles and scrapes.",
        )
        .variables(variables(reconciles, "name"))
        .annotation(
            dashboard.AnnotationQuery()
            .name("Scale events")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("orange")
            .expr(f"{scale_events} > 0")
        )
        .with_row(dashboard.Row("Replicas"))
        .with_panel(
            panel(
                "Desired vs current vs ready vs max replicas",
                "Replicas asked for, pods that exist, pods ready to serve (operator metrics), "
                "the autoscaler's bound spec.autoscaling.maxReplicas (only while autoscaling is "
                "on; desired on max means pinned at the bound), and pods whose engine metrics "
                "Prometheus has.",
                [
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_DESIRED_REPLICAS, OPERATOR)})",
                        "{{name}} desired",
                    ),
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_MAX_REPLICAS, OPERATOR)})",
                        "{{name}} max",
                    ),
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_CURRENT_REPLICAS, OPERATOR)})",
                        "{{name}} current",
                    ),
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_READY_REPLICAS, OPERATOR)})",
                        "{{name}} ready",
                    ),
                    (
                        f"count by (namespace, model) ({sel(names.ENGINE_INFO, ENGINE)})",
                        "{{model}} reporting metrics",
                    ),
                ],
                width=24,
            )
        )
        .with_row(dashboard.Row("Autoscaler"))
        .with_panel(
            panel(
                "Observed queue depth",
                "Average waiting interactive requests per replica over the autoscaling window, "
                "as the autoscaler saw it (compare with spec.autoscaling.targetQueueDepth).",
                [(f"max by ({by}) ({sel(names.OPERATOR_QUEUE_DEPTH, OPERATOR)})", "{{name}}")],
                width=8,
            )
        )
        .with_panel(
            panel(
                "Observed p95 latency",
                "p95 of the autoscaling latency metric over the window, as the autoscaler saw "
                "it (compare with spec.autoscaling.targetLatencyP95Milliseconds).",
                [(f"max by ({by}) ({sel(names.OPERATOR_P95_SECONDS, OPERATOR)})", "{{name}}")],
                unit="s",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Arrivals vs what the ready replicas carry",
                "Requests/s arriving over the window, as the autoscaler saw them, and the ready "
                "replicas times what one serves at the aim (learned from their latency; absent "
                "until learned). Arrivals above the second line: replicas are on their way.",
                [
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_ARRIVALS, OPERATOR)})",
                        "{{name}} arrivals",
                    ),
                    (
                        f"max by ({by}) ({sel(names.OPERATOR_REPLICA_CAPACITY, OPERATOR)}) "
                        f"* max by ({by}) ({sel(names.OPERATOR_READY_REPLICAS, OPERATOR)})",
                        "{{name}} ready x capacity",
                    ),
                ],
                unit="reqps",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Scale events",
                "Scale decisions applied, by direction and reason (also shown as annotations).",
                [(scale_events, "{{name}} {{direction}} {{reason}}")],
                width=8,
                bars=True,
            )
        )
        .with_panel(
            panel(
                "Waiting interactive requests per pod (engine)",
                "The engine's own gauge, which the autoscaler averages over its window.",
                [
                    (
                        f"sum by (pod) ({sel(names.REQUESTS_WAITING, ENGINE, interactive)})",
                        "{{pod}}",
                    )
                ],
            )
        )
        .with_panel(
            panel(
                "Autoscaler scrape failures/s",
                "Pod /metrics scrapes by the autoscaler that failed or timed out.",
                [(f"sum by (name) ({rate(names.OPERATOR_SCRAPE_FAILURES, OPERATOR)})", "{{name}}")],
            )
        )
        .with_row(dashboard.Row("Reconciles"))
        .with_panel(
            panel(
                "Reconcile errors/s",
                "Reconciles that raised (kopf retries them); 0 while every reconcile succeeds.",
                [
                    (
                        f"sum by (name) ({rate(names.OPERATOR_RECONCILE_ERRORS, OPERATOR)})"
                        f" or sum by (name) ({rate(reconciles, OPERATOR)}) * 0",
                        "{{name}}",
                    )
                ],
            )
        )
        .with_panel(
            panel(
                "Reconcile duration",
                "One reconcile (render, create-or-patch, status), p50/p95/p99.",
                [
                    (
                        quantile(q, names.OPERATOR_RECONCILE_SECONDS, OPERATOR, ""),
                        f"p{round(q * 100)}",
                    )
                    for q in QUANTILES
                ],
                unit="s",
            )
        )
    )
    return built
