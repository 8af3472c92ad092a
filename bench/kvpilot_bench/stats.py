"""From request records to the report's numbers. Pure.

Which requests each figure counts:
- TTFT and inter-token latency: streaming requests that received a first token, cancelled ones
  included (until they were cancelled they waited like the others); ITL pools every gap.
- End-to-end latency: requests that completed (ok). Errors and rejections (429) are counted by
  kind and never enter a latency.
- Throughput: completed requests per second and output tokens per second (tokens of completed
  and cancelled requests) over the run's duration.
- Goodput: the share of requests that completed within every SLO given (TTFT applies to
  streaming requests, end-to-end to all), out of those the client did not give up on itself
  (sent minus cancelled and interrupted); with no SLO, the share that completed.
- Structured answers (structured()): those of completed structured requests are checked
  (validity.py); valid_share is valid / checked, and each failure kind is counted. Requests that
  did not complete are counted in errors, never as invalid answers.
Percentiles interpolate linearly between order statistics, numpy's default method.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvpilot_bench.client import Record
from kvpilot_bench.validity import FAILURES

PERCENTILES = (50, 90, 95, 99)
ERROR_KINDS = (
    "rejected",  # 429: the server refused to queue it
    "client_error",  # any other 4xx
    "server_error",  # 5xx, or an error event inside a stream
    "timeout",  # the client's own deadline
    "connection_error",
    "interrupted",  # closed by Ctrl-C
)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, rec: Record) -> bool:
        if rec.outcome != "ok":
            return False
        ttft_ok = self.ttft_ms is None or not rec.stream or _within(rec.ttft, self.ttft_ms)
        return ttft_ok and (self.e2e_ms is None or _within(rec.e2e, self.e2e_ms))


def _within(seconds: float | None, limit_ms: float) -> bool:
    return seconds is not None and seconds * 1000.0 <= limit_ms


def kind(outcome: str) -> str | None:
    """The error kind of an outcome; None for ok and cancelled."""
    if outcome in ("ok", "cancelled"):
        return None
    if outcome == "http_429":
        return "rejected"
    if outcome.startswith("http_4"):
        return "client_error"
    if outcome.startswith("http_") or outcome == "stream_error":
        return "server_error"
    return outcome if outcome in ERROR_KINDS else "connection_error"


def percentiles(seconds: Iterable[float]) -> dict | None:
    """count, mean, p50/p90/p95/p99 and max, in milliseconds; None for no samples."""
    values = np.asarray(list(seconds), dtype=float) * 1000.0
    if values.size == 0:
        return None
    qs = np.percentile(values, PERCENTILES)
    out = {"count": int(values.size), "mean": float(values.mean())}
    out.update({f"p{p}": float(q) for p, q in zip(PERCENTILES, qs, strict=True)})
    out["max"] = float(values.max())
    return out


def goodput(records: list[Record], slo: Slo, duration_s: float) -> dict:
    eligible = [r for r in records if r.outcome not in ("cancelled", "interrupted")]
    met = sum(slo.met(r) for r in eligible)
    return {
        "met": met,
        "eligible": len(eligible),
        "share": met / len(eligible) if eligible else None,
        "requests_per_s": met / duration_s if duration_s > 0 else 0.0,
    }


def summarize(records: list[Record], duration_s: float, slo: Slo) -> dict:
    outcomes = Counter(r.outcome for r in records)
    errors = dict.fromkeys(ERROR_KINDS, 0)
    for outcome, n in outcomes.items():
        assert outcome is not None  # the runner marks what the stop closed "interrupted"
        k = kind(outcome)
        if k is not None:
            errors[k] += n
    streamed = [r for r in records if r.stream and r.ttft is not None]
    ok = [r for r in records if r.outcome == "ok"]
    served = [r for r in records if r.outcome in ("ok", "cancelled")]
    tokens_out = sum(r.tokens_out for r in served)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return {
        "sent": len(records),
        "ok": outcomes.get("ok", 0),
        "cancelled": outcomes.get("cancelled", 0),
        "planned_cancellations": sum(r.planned_cancel for r in records),
        "outcomes": dict(sorted(outcomes.items())),
        "errors": errors,
        "ttft_ms": percentiles(r.ttft for r in streamed if r.ttft is not None),
        "itl_ms": percentiles(gap for r in streamed for gap in r.itl),
        "e2e_ms": percentiles(r.e2e for r in ok if r.e2e is not None),
        "requests_per_s": per_s(len(ok)),
        "output_tokens_per_s": per_s(tokens_out),
        "tokens_in": sum(r.tokens_in or 0 for r in ok),
        "tokens_out": tokens_out,
        "goodput": goodput(records, slo, duration_s),
    }


def structured(records: list[Record]) -> dict:
    """How many structured requests were sent, checked (they completed) and valid, the failures
    by kind, and the same per variant."""
    sent = [r for r in records if r.variant is not None]
    checked = [r for r in sent if r.valid is not None]
    failures = dict.fromkeys(FAILURES, 0)
    for r in checked:
        if r.failure is not None:
            failures[r.failure] += 1
    variants: dict[str, dict] = {}
    for r in sent:
        assert r.variant is not None
        v = variants.setdefault(r.variant, {"sent": 0, "checked": 0, "valid": 0})
        v["sent"] += 1
        v["checked"] += r.valid is not None
        v["valid"] += bool(r.valid)
    for v in variants.values():
        v["valid_share"] = v["valid"] / v["checked"] if v["checked"] else None
    valid = sum(bool(r.valid) for r in checked)
    return {
        "sent": len(sent),
        "checked": len(checked),
        "valid": valid,
        "valid_share": valid / len(checked) if checked else None,
        "failures": failures,
        "variants": dict(sorted(variants.items())),
    }


def timeline(records: list[Record], duration_s: float, bin_s: float = 1.0) -> dict:
    """Per bin: completed requests/s, output tokens/s (a streamed token when it arrived, a
    non-streamed answer's tokens spread evenly over its life), and requests in flight at the
    bin's middle."""
    bins = max(1, int(np.ceil(duration_s / bin_s)))
    edges = np.arange(bins + 1) * bin_s
    ends = np.array([r.sent_at + (r.e2e or 0.0) for r in records])
    starts = np.array([r.sent_at for r in records])
    ok_ends = [r.sent_at + r.e2e for r in records if r.outcome == "ok" and r.e2e is not None]
    completed = np.histogram(ok_ends, edges)[0] / bin_s
    token_times: list[float] = []
    for r in records:
        if r.outcome not in ("ok", "cancelled"):
            continue
        if r.stream and r.ttft is not None:
            token_times += list(r.sent_at + r.ttft + np.cumsum([0.0, *r.itl]))
        elif r.e2e is not None and r.tokens_out:  # not streamed: spread over its life
            token_times += list(np.linspace(r.sent_at, r.sent_at + r.e2e, r.tokens_out + 1)[1:])
    tokens = np.histogram(token_times, edges)[0] / bin_s
    middles = edges[:-1] + bin_s / 2
    in_flight = [int(((starts <= t) & (ends > t)).sum()) for t in middles] if len(starts) else []
    return {
        "bin_s": bin_s,
        "t": [float(t) for t in edges[:-1]],
        "completed_per_s": [float(v) for v in completed],
        "output_tokens_per_s": [float(v) for v in tokens],
        "in_flight": in_flight or [0] * bins,
    }
