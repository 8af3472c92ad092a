"""Prometheus metric names: defined once, shared by the server, the operator and dashboards.

Pure: imports nothing heavy, so the operator can use it without torch. Each engine metric has a
vLLM counterpart (docs/metrics.md) so Gateway API Inference Extension and KEDA recipes apply.
"""

REQUESTS_WAITING = "kvpilot_requests_waiting"  # vllm:num_requests_waiting
REQUESTS_RUNNING = "kvpilot_requests_running"  # vllm:num_requests_running
# HTTP-side admission: requests being parsed and tokenized count here before the engine sees them.
REQUESTS_IN_FLIGHT = "kvpilot_requests_in_flight"  # no vLLM counterpart
KV_CACHE_USAGE = "kvpilot_kv_cache_usage_ratio"  # vllm:kv_cache_usage_perc
TIME_TO_FIRST_TOKEN = "kvpilot_time_to_first_token_seconds"  # vllm:time_to_first_token_seconds
INTER_TOKEN_LATENCY = "kvpilot_inter_token_latency_seconds"  # vllm:inter_token_latency_seconds
E2E_LATENCY = "kvpilot_e2e_request_latency_seconds"  # vllm:e2e_request_latency_seconds
QUEUE_TIME = "kvpilot_request_queue_time_seconds"  # vllm:request_queue_time_seconds
PROMPT_TOKENS = "kvpilot_prompt_tokens_total"  # vllm:prompt_tokens_total
GENERATION_TOKENS = "kvpilot_generation_tokens_total"  # vllm:generation_tokens_total
REQUESTS = "kvpilot_requests_total"  # vllm:request_success_total (ours counts every outcome)
PREEMPTIONS = "kvpilot_preemptions_total"  # vllm:num_preemptions_total
PREFIX_CACHE_QUERIES = "kvpilot_prefix_cache_queries_total"  # vllm:prefix_cache_queries_total
PREFIX_CACHE_HITS = "kvpilot_prefix_cache_hits_total"  # vllm:prefix_cache_hits_total
# Prompt tokens the model computed (requested minus cache hits, plus recomputation).
PREFILL_TOKENS = "kvpilot_prefill_tokens_total"  # no vLLM counterpart
ENGINE_INFO = "kvpilot_engine_info"  # vllm:cache_config_info
# Speculative decoding (served with --speculative only): steps where a sequence had draft
# tokens, the draft tokens proposed, and those the model accepted.
SPEC_DRAFTS = "kvpilot_spec_decode_num_drafts_total"  # vllm:spec_decode_num_drafts_total
SPEC_DRAFT_TOKENS = "kvpilot_spec_decode_num_draft_tokens_total"  # vllm:..._num_draft_tokens_total
SPEC_ACCEPTED_TOKENS = "kvpilot_spec_decode_num_accepted_tokens_total"  # vllm: the same suffix
# Requests with a structured-output constraint (label kind: json, json_object, regex, choice,
# grammar, tools), and the time each spent waiting for its grammar (0 when cached).
STRUCTURED_REQUESTS = "kvpilot_structured_requests_total"  # no vLLM counterpart
GRAMMAR_COMPILE_TIME = "kvpilot_grammar_compile_seconds"  # no vLLM counterpart
RATE_LIMITED = "kvpilot_rate_limited_total"  # labels model, tenant, limit; no vLLM counterpart

# LoRA adapters (label adapter: the adapter's name; the base model's requests are not in these).
LORA_REQUESTS = "kvpilot_lora_requests_total"  # labels model, adapter, outcome
LORA_PROMPT_TOKENS = "kvpilot_lora_prompt_tokens_total"
LORA_GENERATION_TOKENS = "kvpilot_lora_generation_tokens_total"
LORA_E2E_LATENCY = "kvpilot_lora_e2e_request_latency_seconds"
LORA_TIME_TO_FIRST_TOKEN = "kvpilot_lora_time_to_first_token_seconds"
# 1 per adapter a replica has loaded: what the gateway routes an adapter's requests by.
LORA_LOADED = "kvpilot_lora_adapter_loaded"  # labels model, adapter
# 1 per adapter in one of the engine's slots now (--max-loras of them: LORA_SLOTS), which a
# request for it uses without evicting another: the gateway prefers such a replica.
LORA_RESIDENT = "kvpilot_lora_adapter_resident"  # labels model, adapter
LORA_SLOTS = "kvpilot_lora_slots"  # label model
# vLLM's: labels max_lora, running_lora_adapters and waiting_lora_adapters (comma-separated
# names), its value the time of the scrape; the Inference Gateway's LoRA affinity reads it.
VLLM_LORA_REQUESTS_INFO = "vllm:lora_requests_info"

# Label values that the server writes and the dashboards, the alerts and the autoscaler select on.
# REQUESTS' outcome is a finish reason (stop, length, abort, ...) or one of these two:
OUTCOME_REJECTED = "rejected"  # refused before running: invalid (400) or overloaded (429)
OUTCOME_ERROR = "error"  # failed: 500s, 408 timeouts, a step that failed
# REQUESTS_WAITING's and REQUESTS_RUNNING's class: the scheduler's two priorities.
CLASS_INTERACTIVE, CLASS_BATCH = "interactive", "batch"

# The same state under vLLM's own names, for consumers that cannot be pointed at ours: the
# Gateway API Inference Extension's endpoint picker reads these by default, and KEDA recipes
# written for vLLM query them. Gauges carry vLLM's labels model_name and engine; the cache
# info carries block_size and num_gpu_blocks (what the endpoint picker parses) and engine.
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"  # kvpilot_requests_waiting summed
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"  # kvpilot_requests_running summed
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a 0-1 fraction despite the name
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"

# Seconds; vLLM's TTFT buckets extended so a p95 between 5 ms and 60 s interpolates well.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    60.0,
    120.0,
)

# Operator metrics, labels namespace and name (scale events also direction and reason).
OPERATOR_DESIRED_REPLICAS = "kvpilot_operator_desired_replicas"
OPERATOR_CURRENT_REPLICAS = "kvpilot_operator_current_replicas"
OPERATOR_READY_REPLICAS = "kvpilot_operator_ready_replicas"
OPERATOR_MAX_REPLICAS = "kvpilot_operator_max_replicas"
OPERATOR_QUEUE_DEPTH = "kvpilot_operator_observed_queue_depth"
OPERATOR_P95_SECONDS = "kvpilot_operator_observed_p95_seconds"
OPERATOR_ARRIVALS = "kvpilot_operator_observed_arrivals_per_second"
# What the autoscaler learned one replica serves at its aim; absent until it has a figure.
OPERATOR_REPLICA_CAPACITY = "kvpilot_operator_replica_capacity_requests_per_second"
OPERATOR_SCALE_EVENTS = "kvpilot_operator_scale_events_total"
OPERATOR_SCRAPE_FAILURES = "kvpilot_operator_scrape_failures_total"
OPERATOR_RECONCILE_ERRORS = "kvpilot_operator_reconcile_errors_total"
OPERATOR_RECONCILE_SECONDS = "kvpilot_operator_reconcile_duration_seconds"

# Gateway metrics (kvpilot gateway), labels namespace and model (the ModelDeployment's name).
GATEWAY_REQUESTS = "kvpilot_gateway_requests_total"  # and outcome
GATEWAY_UNROUTED = "kvpilot_gateway_unrouted_requests_total"  # reason; no model label
GATEWAY_HELD = "kvpilot_gateway_requests_held"
GATEWAY_HOLD_SECONDS = "kvpilot_gateway_hold_seconds"  # and outcome
GATEWAY_IN_FLIGHT = "kvpilot_gateway_requests_in_flight"
GATEWAY_UPSTREAM_SECONDS = "kvpilot_gateway_upstream_latency_seconds"
GATEWAY_ROUTING = "kvpilot_gateway_routing_decisions_total"  # and reason
GATEWAY_RETRIES = "kvpilot_gateway_upstream_retries_total"
GATEWAY_RESUMES = "kvpilot_gateway_stream_resumes_total"  # and reason
GATEWAY_RATE_LIMITED = "kvpilot_gateway_rate_limited_total"  # tenant, limit; no model label
