"""Per-adapter series: requests, tokens and latency under an `adapter` label, which adapters
are loaded (read at scrape time from the engine's stats), and vLLM's lora_requests_info for
gateways written against vLLM. Kept apart from the model's series so that those keep their
labels, which the dashboards, alerts and autoscaler select on."""

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from kvpilot_common import metric_names as names
from kvpilot_server.outputs import RequestOutput


class AdapterMetrics:
    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        labels = ["model", "adapter"]
        self.requests = Counter(
            names.LORA_REQUESTS,
            "Finished requests for a LoRA adapter by outcome",
            [*labels, "outcome"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            names.LORA_PROMPT_TOKENS,
            "Prompt tokens of an adapter's requests",
            labels,
            registry=registry,
        )
        self.generation_tokens = Counter(
            names.LORA_GENERATION_TOKENS, "Tokens an adapter generated", labels, registry=registry
        )
        buckets = names.LATENCY_BUCKETS
        self.e2e = Histogram(
            names.LORA_E2E_LATENCY,
            "An adapter's request latency, arrival to finish",
            labels,
            buckets=buckets,
            registry=registry,
        )
        self.ttft = Histogram(
            names.LORA_TIME_TO_FIRST_TOKEN,
            "An adapter's time to first token",
            labels,
            buckets=buckets,
            registry=registry,
        )

    def observe(self, adapter: str, output: RequestOutput | None, outcome: str) -> None:
        self.requests.labels(self.model, adapter, outcome).inc()
        if output is None:
            return
        m, usage = output.metrics, output.usage
        self.prompt_tokens.labels(self.model, adapter).inc(usage.prompt_tokens)
        self.generation_tokens.labels(self.model, adapter).inc(usage.completion_tokens)
        if m.first_token_time is not None:
            self.ttft.labels(self.model, adapter).observe(m.first_token_time - m.arrival_time)
            end = m.finished_time or m.last_token_time or m.first_token_time
            self.e2e.labels(self.model, adapter).observe(end - m.arrival_time)


def collect_loaded(model: str, stats, max_loras: int) -> Iterator[Metric]:
    """The scrape-time series of which adapters are loaded, running and waiting."""
    loaded = GaugeMetricFamily(
        names.LORA_LOADED, "LoRA adapters loaded on this replica", labels=["model", "adapter"]
    )
    for adapter in stats.adapters:
        loaded.add_metric([model, adapter], 1)
    yield loaded
    resident = GaugeMetricFamily(
        names.LORA_RESIDENT,
        "LoRA adapters in one of the engine's slots",
        labels=["model", "adapter"],
    )
    for adapter in stats.adapters_resident:
        resident.add_metric([model, adapter], 1)
    yield resident
    slots = GaugeMetricFamily(names.LORA_SLOTS, "The engine's LoRA slots", labels=["model"])
    slots.add_metric([model], max_loras)
    yield slots
    info = GaugeMetricFamily(
        names.VLLM_LORA_REQUESTS_INFO,
        "Running and waiting LoRA adapters (vLLM's series)",
        labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    )
    running, waiting = ",".join(stats.adapters_running), ",".join(stats.adapters_waiting)
    info.add_metric([str(max_loras), running, waiting], time.time())
    yield info
