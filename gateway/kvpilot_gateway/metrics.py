"""The gateway's own /metrics: requests by model and outcome, held requests and how long they
waited, upstream latency, routing decisions by reason. Labels are the ModelDeployment's
namespace and name (not the client's spelling of `model`, which is unbounded)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvpilot_common import metric_names as names

# A cold start is seconds for a small model and minutes for a large one.
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
LABELS = ["namespace", "model"]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            names.GATEWAY_REQUESTS,
            "Requests by outcome (ok, upstream_error, client_closed, overloaded, starting, "
            "unavailable, or the upstream's HTTP error class)",
            [*LABELS, "outcome"],
            registry=r,
        )
        self.unrouted = Counter(
            names.GATEWAY_UNROUTED,
            "Requests answered before a model was known: unreadable body, unknown model (a missing "
            "API key is refused before routing and counted nowhere here)",
            ["reason"],
            registry=r,
        )
        self.held = Gauge(
            names.GATEWAY_HELD, "Requests waiting for a ready replica", LABELS, registry=r
        )
        self.hold_seconds = Histogram(
            names.GATEWAY_HOLD_SECONDS,
            "Time requests were held, by how the hold ended (ready, timeout, client_closed)",
            [*LABELS, "outcome"],
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            names.GATEWAY_IN_FLIGHT, "Requests being proxied to a replica", LABELS, registry=r
        )
        self.upstream_seconds = Histogram(
            names.GATEWAY_UPSTREAM_SECONDS,
            "Time from sending a request to a replica to its response headers (for a stream: "
            "its first byte)",
            LABELS,
            buckets=names.LATENCY_BUCKETS,
            registry=r,
        )
        self.routing = Counter(
            names.GATEWAY_ROUTING,
            "Replica choices by reason (affinity, overflow, least-load, round-robin)",
            [*LABELS, "reason"],
            registry=r,
        )
        self.rate_limited = Counter(
            names.GATEWAY_RATE_LIMITED,
            "Requests refused (429) by a tenant's limit: requests or tokens per minute",
            ["tenant", "limit"],
            registry=r,
        )
        self.resumes = Counter(
            names.GATEWAY_RESUMES,
            "Streams continued on another replica after theirs broke mid-stream, by why it "
            "broke (connection, idle_timeout, error_event, ended_early)",
            [*LABELS, "reason"],
            registry=r,
        )
        self.retries = Counter(
            names.GATEWAY_RETRIES,
            "Attempts sent to another replica after one failed before answering (one request "
            "may add up to --retries)",
            LABELS,
            registry=r,
        )
