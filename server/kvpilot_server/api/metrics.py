"""The engine's Prometheus metrics: request histograms and counters updated as outputs arrive,
queue and cache state read at scrape time from the engine thread's latest stats snapshot."""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvpilot_common import metric_names as names
from kvpilot_server.api.adapter_metrics import AdapterMetrics, collect_loaded
from kvpilot_server.api.admission import Admission
from kvpilot_server.engine.runtime.async_engine import AsyncEngine
from kvpilot_server.engine.runtime.llm_engine import EngineStats
from kvpilot_server.engine.runtime.sequence import Priority
from kvpilot_server.outputs import RequestOutput

# The api label of each route that runs the engine; a request's API is its route's.
APIS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/embeddings": "embeddings",
}


def api_of(path: str) -> str:
    return APIS.get(path, "other")


# The class label of each scheduler priority.
CLASSES = {Priority.INTERACTIVE: names.CLASS_INTERACTIVE, Priority.BATCH: names.CLASS_BATCH}


class EngineCollector:
    """Gauges and counters the engine already keeps, read when Prometheus scrapes."""

    def __init__(self, engine: AsyncEngine, model: str) -> None:
        self.engine, self.model = engine, model

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        labels = ["model", "class"]
        waiting = GaugeMetricFamily(
            names.REQUESTS_WAITING, "Requests waiting to run", labels=labels
        )
        running = GaugeMetricFamily(names.REQUESTS_RUNNING, "Requests running", labels=labels)
        for priority in stats.running:
            cls = CLASSES[priority]
            waiting.add_metric([self.model, cls], stats.waiting[priority])
            running.add_metric([self.model, cls], stats.running[priority])
        yield waiting
        yield running
        yield self._gauge(
            names.KV_CACHE_USAGE, "Fraction of KV cache blocks in use", stats.kv_cache_usage
        )
        cfg = self.engine.config
        counters = [
            (names.PREEMPTIONS, "Preemptions", stats.num_preemptions),
            (names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up", stats.prefix_cache_queries),
            (names.PREFIX_CACHE_HITS, "Prompt tokens served from cache", stats.prefix_cache_hits),
            (names.PREFILL_TOKENS, "Prompt tokens computed", stats.num_prefill_tokens),
        ]
        if cfg.speculative != "none":
            spec = stats.speculation
            counters += [
                (names.SPEC_DRAFTS, "Steps where a sequence had draft tokens", spec.drafts),
                (names.SPEC_DRAFT_TOKENS, "Draft tokens proposed", spec.draft_tokens),
                (names.SPEC_ACCEPTED_TOKENS, "Draft tokens accepted", spec.accepted_tokens),
            ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name.removesuffix("_total"), doc, labels=["model"])
            counter.add_metric([self.model], value)
            yield counter
        info = GaugeMetricFamily(
            names.ENGINE_INFO,
            "Engine configuration",
            labels=["model", "block_size", "num_blocks", "max_model_len"],
        )
        info.add_metric(
            [
                self.model,
                str(cfg.block_size),
                str(self.engine.num_blocks),
                str(self.engine.max_model_len),
            ],
            1,
        )
        yield info
        yield from self._vllm(stats)
        if cfg.enable_lora:
            yield from collect_loaded(self.model, stats, cfg.max_loras)

    def _vllm(self, stats: EngineStats) -> Iterator[Metric]:
        """The endpoint picker and KEDA's vLLM recipes read only vLLM's names. Always on, not
        behind a flag: a pod must be routable by a gateway that already runs with its defaults
        without anyone knowing to turn something on, and it costs four series per scrape.
        Read from the same snapshot as the kvpilot series, so one scrape never disagrees."""
        labels, values = ["model_name", "engine"], [self.model, "0"]  # one engine per process
        for name, doc, value in [
            (names.VLLM_REQUESTS_WAITING, "Requests waiting to run", sum(stats.waiting.values())),
            (names.VLLM_REQUESTS_RUNNING, "Requests running", sum(stats.running.values())),
            (names.VLLM_KV_CACHE_USAGE, "KV cache usage, 1 means full", stats.kv_cache_usage),
        ]:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        info = GaugeMetricFamily(
            names.VLLM_CACHE_CONFIG_INFO,
            "KV cache configuration",
            labels=["block_size", "num_gpu_blocks", "engine"],
        )
        info.add_metric([str(self.engine.config.block_size), str(self.engine.num_blocks), "0"], 1)
        yield info

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, doc, labels=["model"])
        gauge.add_metric([self.model], value)
        return gauge


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model: str, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, model))
        self.model = model
        in_flight = Gauge(
            names.REQUESTS_IN_FLIGHT,
            "Engine requests admitted by the HTTP server and not yet finished (one per choice)",
            ["model"],
            registry=self.registry,
        )
        in_flight.labels(model).set_function(lambda: admission.in_flight)
        buckets = names.LATENCY_BUCKETS

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["model"], buckets=buckets, registry=self.registry)

        self.ttft = histogram(names.TIME_TO_FIRST_TOKEN, "Time to first token")
        self.itl = histogram(names.INTER_TOKEN_LATENCY, "Time between output tokens")
        self.e2e = histogram(names.E2E_LATENCY, "Request latency, arrival to finish")
        self.queue = histogram(names.QUEUE_TIME, "Time waiting before first scheduled")
        self.prompt_tokens = Counter(
            names.PROMPT_TOKENS, "Prompt tokens", ["model"], registry=self.registry
        )
        self.generation_tokens = Counter(
            names.GENERATION_TOKENS, "Generated tokens", ["model"], registry=self.registry
        )
        self.requests = Counter(
            names.REQUESTS,
            "Finished requests by API (chat, completions, responses, messages, embeddings) and "
            "outcome",
            ["model", "api", "outcome"],
            registry=self.registry,
        )
        self.structured = Counter(
            names.STRUCTURED_REQUESTS,
            "Requests with a structured-output constraint, by kind",
            ["model", "kind"],
            registry=self.registry,
        )
        self.grammar_compile = histogram(
            names.GRAMMAR_COMPILE_TIME, "Time a request waited for its grammar (0 if cached)"
        )
        self.rate_limited = Counter(
            names.RATE_LIMITED,
            "Requests refused (429) by a tenant's limit: requests or tokens per minute",
            ["model", "tenant", "limit"],
            registry=self.registry,
        )
        self.adapters = AdapterMetrics(self.registry, model)

    def refused(self, tenant: str, limit: str) -> None:
        self.rate_limited.labels(self.model, tenant, limit).inc()

    def observe_grammar(self, kind: str, seconds: float) -> None:
        self.structured.labels(self.model, kind).inc()
        self.grammar_compile.labels(self.model).observe(seconds)

    def observe_finished(
        self, output: RequestOutput | None, outcome: str, api: str, adapter: str | None = None
    ) -> None:
        """Record one finished request (output None: it failed before producing any) of an API
        (api_of()); one for a LoRA adapter is also counted under its name."""
        self.requests.labels(self.model, api, outcome).inc()
        if adapter is not None:
            self.adapters.observe(adapter, output, outcome)
        if output is None:
            return
        m, usage = output.metrics, output.usage
        self.prompt_tokens.labels(self.model).inc(usage.prompt_tokens)
        self.generation_tokens.labels(self.model).inc(usage.completion_tokens)
        if m.first_scheduled_time is not None:
            self.queue.labels(self.model).observe(m.first_scheduled_time - m.arrival_time)
        if m.first_token_time is not None:
            self.ttft.labels(self.model).observe(m.first_token_time - m.arrival_time)
            end = m.finished_time or m.last_token_time or m.first_token_time
            self.e2e.labels(self.model).observe(end - m.arrival_time)
        itl = self.itl.labels(self.model)
        for gap in m.inter_token_latencies:
            itl.observe(gap)
