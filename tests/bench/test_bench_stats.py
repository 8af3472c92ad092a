"""kvpilot bench's numbers on known samples: percentiles equal numpy's (and hand-computed values),
goodput counts what it says, errors never become latencies, and the timeline adds up."""

import numpy as np
import pytest

from kvpilot_bench.client import Record
from kvpilot_bench.stats import Slo, goodput, kind, percentiles, summarize, timeline

SAMPLES = {
    "one to a hundred": np.arange(1, 101) / 1000.0,
    "single": np.array([0.25]),
    "two": np.array([0.010, 0.030]),
    "ties": np.array([0.1, 0.1, 0.1, 0.5]),
    "lognormal": np.random.default_rng(7).lognormal(-3.0, 1.0, 997),
    "unsorted": np.array([0.9, 0.01, 0.5, 0.05, 0.3, 0.2, 0.07]),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_percentiles_equal_numpy(name):
    seconds = SAMPLES[name]
    got = percentiles(seconds)
    ms = seconds * 1000.0
    assert got["count"] == len(ms)
    for q in (50, 90, 95, 99):
        assert got[f"p{q}"] == pytest.approx(np.percentile(ms, q), rel=1e-12)
    assert got["mean"] == pytest.approx(ms.mean())
    assert got["max"] == pytest.approx(ms.max())


def test_percentiles_known_values():
    got = percentiles(np.arange(1, 101) / 1000.0)  # 1..100 ms
    assert (got["p50"], got["p90"], got["p95"], got["p99"]) == pytest.approx(
        (50.5, 90.1, 95.05, 99.01)
    )
    assert percentiles([]) is None
    assert percentiles([0.2])["p99"] == pytest.approx(200.0)


def _rec(i, outcome="ok", ttft=0.1, e2e=1.0, stream=True, itl=(), cls="chat", out=10):
    return Record(
        index=i,
        cls=cls,
        stream=stream,
        sent_at=float(i),
        outcome=outcome,
        ttft=ttft if stream else None,
        e2e=e2e,
        itl=list(itl),
        tokens_in=20,
        tokens_out=out,
    )


def test_goodput_against_hand_count():
    slo = Slo(ttft_ms=200, e2e_ms=1500)
    records = [
        _rec(0, ttft=0.1, e2e=1.0),  # met
        _rec(1, ttft=0.3, e2e=1.0),  # TTFT too slow
        _rec(2, ttft=0.1, e2e=2.0),  # E2E too slow
        _rec(3, stream=False, e2e=1.2),  # met: TTFT applies to streams only
        _rec(4, outcome="http_429", ttft=None, e2e=0.01),  # eligible, not met
        _rec(5, outcome="cancelled", e2e=0.5),  # the client gave up: not eligible
        _rec(6, outcome="interrupted", e2e=0.5),  # not eligible
        _rec(7, outcome="timeout", ttft=None, e2e=3.0),  # eligible, not met
        _rec(8, ttft=0.2, e2e=1.5),  # exactly at the SLO: met
    ]
    g = goodput(records, slo, duration_s=10.0)
    assert (g["met"], g["eligible"]) == (3, 7)
    assert g["share"] == pytest.approx(3 / 7)
    assert g["requests_per_s"] == pytest.approx(0.3)
    # Without an SLO, goodput is the share that completed.
    g = goodput(records, Slo(), duration_s=10.0)
    assert (g["met"], g["eligible"]) == (5, 7)
    assert goodput([], slo, 1.0)["share"] is None


def test_summary_counts_add_up_and_errors_are_not_latencies():
    records = [
        _rec(0, ttft=0.05, e2e=0.5, itl=[0.01, 0.02]),
        _rec(1, ttft=0.07, e2e=0.7, itl=[0.03]),
        _rec(2, outcome="cancelled", ttft=0.09, e2e=0.2, itl=[0.04], out=3),
        _rec(3, outcome="http_429", ttft=None, e2e=0.001, out=0),
        _rec(4, outcome="http_429", ttft=None, e2e=0.002, out=0),
        _rec(5, outcome="http_400", ttft=None, e2e=0.003, out=0),
        _rec(6, outcome="http_503", ttft=None, e2e=0.004, out=0),
        _rec(7, outcome="stream_error", ttft=0.02, e2e=0.3, out=0),
        _rec(8, outcome="connection_error", ttft=None, e2e=0.1, out=0),
        _rec(9, outcome="timeout", ttft=None, e2e=5.0, out=0),
        _rec(10, stream=False, e2e=0.9),
    ]
    s = summarize(records, duration_s=2.0, slo=Slo())
    assert s["sent"] == 11 and s["ok"] == 3 and s["cancelled"] == 1
    assert s["errors"] == {
        "rejected": 2,
        "client_error": 1,
        "server_error": 2,
        "timeout": 1,
        "connection_error": 1,
        "interrupted": 0,
    }
    assert s["sent"] == s["ok"] + s["cancelled"] + sum(s["errors"].values())
    assert s["e2e_ms"]["count"] == 3  # ok only: no 429 in a latency
    assert s["e2e_ms"]["p50"] == pytest.approx(np.percentile([500, 700, 900], 50))
    # Streams that saw a first token, the cancelled one included.
    assert s["ttft_ms"]["count"] == 4
    assert s["itl_ms"]["p95"] == pytest.approx(np.percentile([10, 20, 30, 40], 95))
    assert s["requests_per_s"] == pytest.approx(1.5)
    assert s["tokens_out"] == 33 and s["output_tokens_per_s"] == pytest.approx(16.5)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("ok", None),
        ("cancelled", None),
        ("http_429", "rejected"),
        ("http_408", "client_error"),
        ("http_500", "server_error"),
        ("stream_error", "server_error"),
        ("timeout", "timeout"),
        ("connection_error", "connection_error"),
        ("interrupted", "interrupted"),
    ],
)
def test_error_kinds(outcome, expected):
    assert kind(outcome) == expected


def test_timeline_counts_completions_tokens_and_in_flight():
    records = [
        Record(
            0, "c", True, sent_at=0.2, outcome="ok", ttft=0.3, e2e=1.0, itl=[0.2, 0.5], tokens_out=3
        ),
        Record(1, "c", False, sent_at=1.5, outcome="ok", e2e=1.0, tokens_out=4),
        Record(2, "c", False, sent_at=1.6, outcome="http_429", e2e=0.01),
    ]
    line = timeline(records, duration_s=3.0, bin_s=1.0)
    assert line["t"] == [0.0, 1.0, 2.0]
    assert line["completed_per_s"] == [0.0, 1.0, 1.0]  # ends at 1.2 and 2.5
    # Streamed tokens at 0.5, 0.7 | 1.2; the whole answer's 4 over its life: 1.75 | 2, 2.25, 2.5
    assert line["output_tokens_per_s"] == [2.0, 2.0, 3.0]
    assert line["in_flight"] == [1, 1, 0]  # at 0.5, 1.5 (sent at 1.5, not the 429) and 2.5
