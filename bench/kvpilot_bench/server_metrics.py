"""What a kvpilot server says about the run on its /metrics, read as its autoscaler reads it.

While requests run, /metrics is scraped every second and fed to the operator's own observe()
(kvpilot_common/observe.py): the average interactive queue (kvpilot_requests_waiting) and the
p95 of time to first token and of end-to-end latency from the histogram buckets' increase over
the run. Those are the numbers spec.autoscaling.targetQueueDepth and
targetLatencyP95Milliseconds are compared with, so a sweep can recommend targets in the
autoscaler's own units. The outcome counter (kvpilot_requests_total by outcome) is read before
and after, so a report shows that cancelled requests were aborted on the server.
Other servers (vLLM, TGI, llama.cpp) have no such view: the report then says null.
"""

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_common.observe import Window, observe, parse

_LATENCIES = {"ttft": "TimeToFirstToken", "e2e": "EndToEnd"}


def outcomes(text: str) -> dict[str, float]:
    """kvpilot_requests_total by outcome, summed over models."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == names.REQUESTS:
                outcome = s.labels.get("outcome", "")
                counts[outcome] = counts.get(outcome, 0.0) + s.value
    return counts


class Scraper:
    def __init__(self, http: httpx.AsyncClient, root: str, interval: float = 1.0):
        self.http, self.url, self.interval = http, f"{root}/metrics", interval
        self.windows = {key: Window(seconds=float("inf")) for key in _LATENCIES}
        self.before: dict[str, float] | None = None
        self.after: dict[str, float] | None = None
        self.scrapes = 0

    async def _scrape(self) -> dict[str, float] | None:
        try:
            r = await self.http.get(self.url, timeout=5.0)
        except httpx.HTTPError:
            return None
        if r.status_code != 200 or names.REQUESTS_WAITING not in r.text:
            return None
        now = time.monotonic()
        for key, metric in _LATENCIES.items():
            self.windows[key].add("server", parse(r.text, now, metric))
        self.scrapes += 1
        return outcomes(r.text)

    async def start(self) -> bool:
        """The first scrape; False when the server has no kvpilot metrics."""
        self.before = await self._scrape()
        return self.before is not None

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every interval until `stop` is set (bounded by the caller's run)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except TimeoutError:
                await self._scrape()

    async def finish(self) -> None:
        self.after = await self._scrape() or self.after

    def view(self) -> dict | None:
        if self.before is None or self.after is None:
            return None
        now = time.monotonic()
        seen = {key: observe(window, now) for key, window in self.windows.items()}
        ttft, e2e = seen["ttft"], seen["e2e"]
        keys = sorted(set(self.before) | set(self.after))
        delta = {k: round(self.after.get(k, 0.0) - self.before.get(k, 0.0)) for k in keys}
        return {
            "scrapes": self.scrapes,
            "queue_per_replica": None if ttft is None else ttft.queue_per_replica,
            "p95_ttft_ms": _ms(None if ttft is None else ttft.p95_seconds),
            "p95_e2e_ms": _ms(None if e2e is None else e2e.p95_seconds),
            "outcomes": {k: v for k, v in delta.items() if v},
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
