"""kvpilot's Prometheus alert rules, as a rule file's groups (serving, fleet, gateway).

Each alert links its section of docs/runbook.md (tests/monitoring checks every alert has one)
and is unit-tested with promtool in tests/monitoring/alerts_test.yaml. The operator's scrape job
holds "kvpilot" and ends in "-operator", as the chart's ServiceMonitor names it after the
operator's Service (KvpilotOperatorDown uses `up`); the gateway's ends in "-gateway"
(KvpilotGatewayDown).
"""

from typing import Any

from kvpilot_common import metric_names as names

from .promql import OVERLOADED, UPSTREAM_ERRORS, increase, quantile, rate

RUNBOOK_URL = "https://github.com/kvpilot/kvpilot/blob/main/docs/runbook.md"

# The chart's ServiceMonitor names the job after the operator's Service: <release>-kvpilot-operator,
# or <release>-operator when the release name holds "kvpilot".
OPERATOR_JOB = 'job=~".*kvpilot.*-operator"'
# The gateway's ServiceMonitor names it likewise after the gateway's Service.
GATEWAY_JOB = 'job=~".*kvpilot.*-gateway"'


def alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK_URL}#{name.lower()}",
        },
    }


def alert_groups() -> dict[str, Any]:
    md = "{{ $labels.namespace }}/{{ $labels.name }}"
    model = "{{ $labels.namespace }}/{{ $labels.model }}"
    pod = "{{ $labels.namespace }}/{{ $labels.pod }}"
    ready = f"max by (namespace, name) ({names.OPERATOR_READY_REPLICAS})"
    desired = f"max by (namespace, name) ({names.OPERATOR_DESIRED_REPLICAS})"
    requests = f"sum by (namespace, model) ({rate(names.REQUESTS, '', '5m')})"
    failed = f'outcome="{names.OUTCOME_ERROR}"'
    errors = f"sum by (namespace, model) ({rate(names.REQUESTS, '', '5m', failed)})"
    maximum = f"max by (namespace, name) ({names.OPERATOR_MAX_REPLICAS})"
    ready_by_ns = f"sum by (namespace) ({names.OPERATOR_READY_REPLICAS})"
    serving = [
        alert(
            "KvpilotModelUnavailable",
            f"{ready} == 0\nand on (namespace, name)\n{desired} > 0",
            "5m",
            "critical",
            f"ModelDeployment {md} has no ready replica",
            "The autoscaler asks for replicas but none has been ready for 5 minutes: every "
            "request to this model fails.",
        ),
        alert(
            "KvpilotHighErrorRatio",
            f"{errors}\n/\n{requests}\n> 0.05",
            "5m",
            "critical",
            f"{model}: {{{{ $value | humanizePercentage }}}} of requests fail",
            'More than 5% of finished requests ended in outcome="error" (500s, 408 timeouts, '
            "failures mid-stream) over the last 5 minutes, for 5 minutes.",
        ),
        alert(
            "KvpilotLatencyP95High",
            f"{quantile(0.95, names.TIME_TO_FIRST_TOKEN, '', 'namespace, model', '5m')}\n> 2",
            "10m",
            "warning",
            f"{model}: p95 time to first token is {{{{ $value | humanizeDuration }}}}",
            "The p95 time to first token has been above 2 s for 10 minutes.",
        ),
        alert(
            "KvpilotQueueBacklog",
            "avg by (namespace, model) (\n"
            f'  avg_over_time({names.REQUESTS_WAITING}{{class="{names.CLASS_INTERACTIVE}"}}[5m])\n'
            ")\n> 50",
            "10m",
            "warning",
            f'{model}: {{{{ $value | printf "%.0f" }}}} interactive requests waiting per pod',
            "On average more than 50 interactive requests per pod have been waiting to be "
            "scheduled for 10 minutes; the queue is not draining (new requests get 429 once it "
            "reaches --max-waiting).",
        ),
        alert(
            "KvpilotKVCacheFull",
            f"{names.KV_CACHE_USAGE} > 0.95",
            "10m",
            "warning",
            f"{pod}: KV cache {{{{ $value | humanizePercentage }}}} full",
            f"Pod {pod} ({{{{ $labels.model }}}}) has used more than 95% of its KV cache for 10 "
            "minutes: new requests wait and running ones get preempted.",
        ),
        alert(
            "KvpilotPreemptionStorm",
            f"sum by (namespace, model, pod) ({rate(names.PREEMPTIONS, '', '5m')})\n> 1",
            "10m",
            "warning",
            f'{pod}: {{{{ $value | printf "%.1f" }}}} preemptions/s',
            f"Pod {pod} ({{{{ $labels.model }}}}) has preempted more than one running request "
            "per second for 10 minutes: requests are evicted and recomputed, wasting capacity.",
        ),
    ]
    fleet_rules = [
        alert(
            "KvpilotReplicasNotReady",
            f"{ready}\n<\n{desired}",
            "15m",
            "warning",
            f"ModelDeployment {md} has {{{{ $value }}}} ready replicas, fewer than desired",
            "Fewer replicas have been ready than the autoscaler asks for during 15 minutes.",
        ),
        alert(
            "KvpilotModelDeploymentPinnedAtMax",
            f"{desired}\n>=\n{maximum}",
            "30m",
            "warning",
            f"ModelDeployment {md} has been held at maxReplicas ({{{{ $value }}}}) for 30 minutes",
            "The autoscaler has asked for spec.autoscaling.maxReplicas replicas for 30 minutes: "
            "it may add no more, so more load means longer queues and higher latency.",
        ),
        alert(
            "KvpilotMetricsAbsent",
            f"{ready_by_ns}\n>\n(\n  count by (namespace) ({names.ENGINE_INFO})\n"
            f"  or\n  {ready_by_ns} * 0\n)",
            "10m",
            "warning",
            "Prometheus is missing engine metrics in namespace {{ $labels.namespace }}",
            "The operator counts {{ $value }} ready kvpilot pods in namespace "
            "{{ $labels.namespace }} but Prometheus has engine metrics from fewer of them "
            "for 10 minutes: dashboards and alerts for those pods are blind.",
        ),
        alert(
            "KvpilotReconcileErrors",
            f"sum by (namespace, name) ({increase(names.OPERATOR_RECONCILE_ERRORS, '', '10m')})"
            "\n> 0",
            "15m",
            "warning",
            f"Reconciling ModelDeployment {md} keeps failing",
            f"Reconciles of {md} have raised errors continuously for 15 minutes (kopf retries "
            "them); spec changes are not applied.",
        ),
        alert(
            "KvpilotOperatorDown",
            f"max by (job) (up{{{OPERATOR_JOB}}}) == 0\nor\nabsent(up{{{OPERATOR_JOB}}})",
            "5m",
            "critical",
            "The kvpilot operator is down or not scraped",
            "Prometheus has not scraped the kvpilot operator for 5 minutes: ModelDeployments are "
            "neither reconciled nor autoscaled, and their status goes stale.",
        ),
    ]
    by_model = "sum by (namespace, model)"
    gateway_requests = f"{by_model} ({rate(names.GATEWAY_REQUESTS, '', '5m')})"
    timeout = 'outcome="timeout"'
    holds_timed_out = increase(f"{names.GATEWAY_HOLD_SECONDS}_count", "", "5m", timeout)
    gateway_rules = [
        alert(
            "KvpilotGatewayHoldTimeouts",
            f"{by_model} ({holds_timed_out})\n> 0",
            "5m",
            "critical",
            f'{model}: {{{{ $value | printf "%.0f" }}}} held requests timed out in 5 minutes',
            f"Requests for {model} have been held at the gateway until the hold timeout (503, "
            "the model is starting) for 5 minutes: no replica becomes ready, or not within "
            "the hold timeout.",
        ),
        alert(
            "KvpilotGatewayHoldsOverloaded",
            f"{by_model} ({rate(names.GATEWAY_REQUESTS, '', '5m', OVERLOADED)})\n> 0",
            "10m",
            "warning",
            f'{model}: {{{{ $value | printf "%.2f" }}}} requests/s refused over the hold bound',
            f"The gateway has answered requests for {model} with 429 for 10 minutes because "
            "too many were already held waiting for a replica (gateway.maxHeldPerModel for "
            "the model, or gateway.maxHeld in all).",
        ),
        alert(
            "KvpilotGatewayUpstreamErrors",
            f"{by_model} ({rate(names.GATEWAY_REQUESTS, '', '5m', UPSTREAM_ERRORS)})"
            f"\n/\n{gateway_requests}\n> 0.05",
            "5m",
            "critical",
            f"{model}: {{{{ $value | humanizePercentage }}}} of gateway requests fail upstream",
            "More than 5% of the gateway's requests for the model ended in upstream_error (no "
            "replica answered, or a stream broke) or a 5xx from the replica over the last 5 "
            "minutes, for 5 minutes.",
        ),
        alert(
            "KvpilotGatewayDown",
            f"max by (job) (up{{{GATEWAY_JOB}}}) == 0",
            "5m",
            "critical",
            "The kvpilot gateway is down",
            "Prometheus has scraped no kvpilot gateway replica of job {{ $labels.job }} for 5 "
            "minutes: clients of the gateway get no answer, and requests for models at zero "
            "wake nothing.",
        ),
    ]
    return {
        "groups": [
            {"name": "kvpilot-serving", "rules": serving},
            {"name": "kvpilot-fleet", "rules": fleet_rules},
            {"name": "kvpilot-gateway", "rules": gateway_rules},
        ]
    }
