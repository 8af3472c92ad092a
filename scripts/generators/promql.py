"""PromQL building blocks shared by the dashboards and the alert rules.

Counters and histograms are only ever read through rate() or increase() (tests/monitoring checks
it), so these helpers are the one way a query reads them.
"""

from kvpilot_common import metric_names as names

RATE = "$__rate_interval"  # Grafana's window: at least four scrape intervals
QUANTILES = (0.5, 0.95, 0.99)

# Label selectors (inside {...}) for the three families, from the dashboard variables.
ENGINE = 'namespace=~"$namespace", model=~"$model", pod=~"$pod"'
OPERATOR = 'namespace=~"$namespace", name=~"$model"'
GATEWAY = 'namespace=~"$namespace", model=~"$model"'

# Outcomes of the gateway's requests counter: the replicas failed the request, or the
# hold bound refused it.
UPSTREAM_ERRORS = 'outcome=~"upstream_error|5xx"'
OVERLOADED = 'outcome="overloaded"'


def sel(metric: str, selector: str, extra: str = "") -> str:
    inner = ", ".join(s for s in (selector, extra) if s)
    return f"{metric}{{{inner}}}" if inner else metric


def rate(metric: str, selector: str, window: str = RATE, extra: str = "") -> str:
    return f"rate({sel(metric, selector, extra)}[{window}])"


def increase(metric: str, selector: str, window: str = RATE, extra: str = "") -> str:
    return f"increase({sel(metric, selector, extra)}[{window}])"


def quantile(q: float, histogram: str, selector: str, by: str, window: str = RATE) -> str:
    buckets = rate(f"{histogram}_bucket", selector, window)
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q:g}, sum by ({group}) ({buckets}))"


def outcome_ratio(outcome: str, selector: str, by: str, window: str = RATE) -> str:
    """Share of finished requests with one outcome; 0 (not "no data") while none had it."""
    total = f"sum by ({by}) ({rate(names.REQUESTS, selector, window)})"
    only = f'outcome="{outcome}"'
    part = f"sum by ({by}) ({rate(names.REQUESTS, selector, window, only)})"
    return f"({part} or {total} * 0) / {total}"
