"""The operator's own Prometheus metrics (names in kvpilot_common.metric_names)."""

from prometheus_client import Counter, Gauge, Histogram

from kvpilot_common import metric_names as names

LABELS = ["namespace", "name"]
desired = Gauge(names.OPERATOR_DESIRED_REPLICAS, "Replicas the autoscaler asks for", LABELS)
current = Gauge(names.OPERATOR_CURRENT_REPLICAS, "Pods that exist", LABELS)
ready = Gauge(names.OPERATOR_READY_REPLICAS, "Pods ready to serve", LABELS)
max_replicas = Gauge(
    names.OPERATOR_MAX_REPLICAS, "spec.autoscaling.maxReplicas, while autoscaling is on", LABELS
)
queue = Gauge(names.OPERATOR_QUEUE_DEPTH, "Waiting interactive requests per replica", LABELS)
p95 = Gauge(names.OPERATOR_P95_SECONDS, "p95 of the autoscaling latency metric", LABELS)
arrivals = Gauge(names.OPERATOR_ARRIVALS, "Requests arriving per second over the window", LABELS)
capacity = Gauge(
    names.OPERATOR_REPLICA_CAPACITY, "Requests/s one replica serves at the aim, learned", LABELS
)
scale_events = Counter(
    names.OPERATOR_SCALE_EVENTS, "Scale decisions applied", [*LABELS, "direction", "reason"]
)
scrape_failures = Counter(
    names.OPERATOR_SCRAPE_FAILURES, "Pod /metrics scrapes that failed", LABELS
)
reconcile_errors = Counter(names.OPERATOR_RECONCILE_ERRORS, "Reconciles that raised", LABELS)
reconcile_seconds = Histogram(names.OPERATOR_RECONCILE_SECONDS, "Reconcile duration", LABELS)

# Every gauge labelled by one ModelDeployment: a value kept after it is gone, or after nothing
# updates it any more, would keep alerts firing on a stale number.
GAUGES = (desired, current, ready, max_replicas, queue, p95, arrivals, capacity)
AUTOSCALER_GAUGES = (max_replicas, queue, p95, arrivals, capacity)
STATUS_GAUGES = (desired, current, ready)  # every status refresh sets them (set_replicas)


def set_replicas(namespace: str, name: str, wanted: int, existing: int, serving: int) -> None:
    """One ModelDeployment's desired, current and ready replicas."""
    desired.labels(namespace, name).set(wanted)
    current.labels(namespace, name).set(existing)
    ready.labels(namespace, name).set(serving)


def forget(namespace: str, name: str, gauges: tuple[Gauge, ...] = GAUGES) -> None:
    """Drop one ModelDeployment's series from `gauges` (absent ones are skipped)."""
    for gauge in gauges:
        gauge.remove(namespace, name)
