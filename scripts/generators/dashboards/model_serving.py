"""The "kvpilot / Model serving" dashboard: engine latency, throughput, outcomes, scheduler
queues and KV cache, per ModelDeployment and pod."""

from grafana_foundation_sdk.builders import dashboard

from kvpilot_common import metric_names as names

from ..promql import ENGINE, outcome_ratio, quantile, rate, sel
from .common import latency_panel, new_dashboard, panel, variables


def model_serving() -> dashboard.Dashboard:
    ratio = "% of finished engine requests (one per choice)"
    return (
        new_dashboard(
            "kvpilot-model-serving",
            "kvpilot / Model serving",
            "What kvpilot's model servers do: latency, throughput, outcomes, scheduler queues "
            "and KV cache, per ModelDeployment and pod.",
        )
        .variables(variables(names.ENGINE_INFO, "model"))
        .with_row(dashboard.Row("Latency"))
        .with_panel(
            latency_panel(
                "Time to first token",
                names.TIME_TO_FIRST_TOKEN,
                "Arrival to first token, p50/p95/p99 (histogram_quantile over the rate of "
                "the buckets).",
            )
        )
        .with_panel(
            latency_panel(
                "Inter-token latency",
                names.INTER_TOKEN_LATENCY,
                "Gap between consecutive generated tokens, p50/p95/p99.",
            )
        )
        .with_panel(
            latency_panel(
                "End-to-end latency",
                names.E2E_LATENCY,
                "Arrival to finish, p50/p95/p99.",
            )
        )
        .with_row(dashboard.Row("Throughput and outcomes"))
        .with_panel(
            panel(
                "Tokens/s",
                "Prompt tokens processed and tokens generated per second.",
                [
                    (f"sum by (model) ({rate(names.PROMPT_TOKENS, ENGINE)})", "{{model}} prompt"),
                    (
                        f"sum by (model) ({rate(names.GENERATION_TOKENS, ENGINE)})",
                        "{{model}} generation",
                    ),
                ],
            )
        )
        .with_panel(
            panel(
                "Requests/s by outcome",
                "Finished engine requests per second. Outcomes: stop and length (completed), "
                "abort (client left), error (500, 408 timeout, failure mid-stream), "
                "rejected (429 or a 400 from a cost limit, before running). Requests refused "
                "before the server counts them (malformed bodies, 401, 413, 503 while draining) "
                "are not here.",
                [
                    (
                        f"sum by (model, outcome) ({rate(names.REQUESTS, ENGINE)})",
                        "{{model}} {{outcome}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_panel(
            panel(
                "Requests/s by API",
                "Finished engine requests per second by the API they came by: chat, "
                "completions, responses (OpenAI's Responses API), messages (Anthropic's "
                "Messages API), embeddings. Counted as in Requests/s by outcome.",
                [
                    (
                        f"sum by (model, api) ({rate(names.REQUESTS, ENGINE)})",
                        "{{model}} {{api}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_panel(
            panel(
                "Rejected ratio (429 queue full, 400 over a limit)",
                'There is no status-code metric: this is outcome="rejected", requests refused '
                "before running: 429s (waiting queue full) and 400s from the cost limits "
                f"(context length, KV cache capacity) together, as a {ratio}.",
                [(outcome_ratio(names.OUTCOME_REJECTED, ENGINE, "model"), "{{model}}")],
                unit="percentunit",
                ratio=True,
            )
        )
        .with_panel(
            panel(
                "Error ratio (500, 408)",
                'There is no status-code metric: this is outcome="error": 500s, 408 timeouts '
                "and failures after a stream started (an error event in a 200 stream), as a "
                f"{ratio}. 503s (draining, engine loop down) are answered before a request is "
                "counted.",
                [(outcome_ratio(names.OUTCOME_ERROR, ENGINE, "model"), "{{model}}")],
                unit="percentunit",
                ratio=True,
            )
        )
        .with_row(dashboard.Row("Scheduler and KV cache"))
        .with_panel(
            panel(
                "Running vs waiting by class",
                "Engine requests running and waiting to be scheduled, per scheduling class "
                "(interactive, batch).",
                [
                    (
                        f"sum by (model, class) ({sel(names.REQUESTS_RUNNING, ENGINE)})",
                        "{{model}} running {{class}}",
                    ),
                    (
                        f"sum by (model, class) ({sel(names.REQUESTS_WAITING, ENGINE)})",
                        "{{model}} waiting {{class}}",
                    ),
                ],
            )
        )
        .with_panel(
            panel(
                "KV cache usage",
                "Fraction of KV cache blocks referenced by requests, per pod.",
                [(sel(names.KV_CACHE_USAGE, ENGINE), "{{pod}}")],
                unit="percentunit",
                ratio=True,
            )
        )
        .with_panel(
            panel(
                "Prefix cache hit ratio",
                "Prompt tokens served from the prefix cache over prompt tokens looked up "
                "(ratio of rates).",
                [
                    (
                        f"sum by (model) ({rate(names.PREFIX_CACHE_HITS, ENGINE)})"
                        f" / sum by (model) ({rate(names.PREFIX_CACHE_QUERIES, ENGINE)})",
                        "{{model}}",
                    )
                ],
                unit="percentunit",
                ratio=True,
            )
        )
        .with_panel(
            panel(
                "Preemptions/s",
                "Running requests evicted from the KV cache to make room (recomputed later).",
                [(f"sum by (pod) ({rate(names.PREEMPTIONS, ENGINE)})", "{{pod}}")],
            )
        )
        .with_panel(
            panel(
                "Speculative draft tokens/s",
                "Draft tokens proposed and accepted per second (servers started with "
                "--speculative); accepted over proposed is the acceptance rate, and each accepted "
                "token is one decode step saved.",
                [
                    (
                        f"sum by (model) ({rate(names.SPEC_DRAFT_TOKENS, ENGINE)})",
                        "{{model}} proposed",
                    ),
                    (
                        f"sum by (model) ({rate(names.SPEC_ACCEPTED_TOKENS, ENGINE)})",
                        "{{model}} accepted",
                    ),
                ],
            )
        )
        .with_row(dashboard.Row("LoRA adapters"))
        .with_panel(
            panel(
                "Adapter requests/s by outcome",
                "Finished requests per second for each LoRA adapter (spec.adapters), by outcome "
                "as in Requests/s (the base model's are not in these).",
                [
                    (
                        f"sum by (model, adapter, outcome) ({rate(names.LORA_REQUESTS, ENGINE)})",
                        "{{adapter}} {{outcome}}",
                    )
                ],
                unit="reqps",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Adapter tokens/s",
                "Tokens each adapter generated per second.",
                [
                    (
                        f"sum by (model, adapter) ({rate(names.LORA_GENERATION_TOKENS, ENGINE)})",
                        "{{adapter}}",
                    )
                ],
                width=8,
            )
        )
        .with_panel(
            panel(
                "Adapter p95 latency",
                "Arrival to first token and to finish, p95, per adapter.",
                [
                    (
                        quantile(0.95, names.LORA_TIME_TO_FIRST_TOKEN, ENGINE, "model, adapter"),
                        "{{adapter}} first token",
                    ),
                    (
                        quantile(0.95, names.LORA_E2E_LATENCY, ENGINE, "model, adapter"),
                        "{{adapter}} end to end",
                    ),
                ],
                unit="s",
                width=8,
            )
        )
        .with_panel(
            panel(
                "Replicas with each adapter",
                "Replicas that have loaded each adapter, and those that hold it in one of their "
                "engine's slots now (engine.maxLoras of them): a request for an adapter outside "
                "the slots installs it first, evicting the one used least recently.",
                [
                    (
                        f"sum by (model, adapter) ({sel(names.LORA_LOADED, ENGINE)})",
                        "{{adapter}} loaded",
                    ),
                    (
                        f"sum by (model, adapter) ({sel(names.LORA_RESIDENT, ENGINE)})",
                        "{{adapter}} in a slot",
                    ),
                ],
                width=24,
            )
        )
    )
