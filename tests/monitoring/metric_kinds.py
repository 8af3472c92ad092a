"""Which of kvpilot's metrics are histograms, and every metric name: what test_dashboards holds
the generated queries to, and what test_queries checks against Prometheus's own TYPE lines."""

from kvpilot_common import metric_names as names

HISTOGRAMS = {
    names.TIME_TO_FIRST_TOKEN,
    names.INTER_TOKEN_LATENCY,
    names.E2E_LATENCY,
    names.QUEUE_TIME,
    names.OPERATOR_RECONCILE_SECONDS,
    names.GATEWAY_HOLD_SECONDS,
    names.GATEWAY_UPSTREAM_SECONDS,
    names.GRAMMAR_COMPILE_TIME,
    names.LORA_E2E_LATENCY,
    names.LORA_TIME_TO_FIRST_TOKEN,
}
# Every name metric_names declares (a counter's with its _total).
NAMES = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
