"""Server benchmark: the engine-core workload through HTTP (streaming) vs the offline API, in one
run. Prints one JSON document.

1. Throughput: the mixed workload of engine_throughput.py (same seed), all requests at once.
   Offline: `LLM.generate`. HTTP: a `kvpilot serve` process on 127.0.0.1 with the same engine
   settings, every request a streaming /v1/completions call (token-id prompt, greedy, EOS
   ignored) from one asyncio client. Target: HTTP >= 0.9x offline.
2. Added latency: the same short request (32 prompt tokens, 16 out) sent alone, one after the
   other, offline and over HTTP; p50 of HTTP minus p50 offline (noisy: engine steps vary by
   tens of ms here), and the HTTP overhead proper: each request's client-side latency minus the
   server's own arrival-to-finish time for it (from the access log). Target <= 2 ms.

Server and client share the machine's cores, as a sidecar or gateway would.
"""

import argparse
import asyncio
import json
import statistics
import time

import httpx
from engine_throughput import MODEL, workload  # the sibling benchmark, beside this file

from kvpilot_server import LLM, SamplingParams
from kvpilot_testing import results
from kvpilot_testing.live_server import start_server, stop_server

ENGINE_ARGS = {
    "max_model_len": 1024,
    "kv_cache_bytes": 4 << 30,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 2048,
}


async def stream_one(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int, ids: list[str] | None = None
) -> int:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
                if ids is not None and not tokens and chunk["id"] not in ids:
                    ids.append(chunk["id"])
    return tokens


async def http_throughput(base: str, requests) -> dict:
    limits = httpx.Limits(max_connections=len(requests))
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(stream_one(client, p, m) for p, m in requests))
        elapsed = time.perf_counter() - start
    assert sum(counts) == sum(m for _, m in requests)
    return {"elapsed_s": round(elapsed, 2), "output_tokens_per_s": round(sum(counts) / elapsed, 2)}


async def http_latencies(
    base: str, prompt: list[int], max_tokens: int, runs: int
) -> dict[str, float]:
    """Client-side latency of each request, by the response id the server logs it under."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await stream_one(client, prompt, max_tokens)  # warm up the connection and the path
        samples = {}
        for _ in range(runs):
            ids: list[str] = []
            start = time.perf_counter()
            await stream_one(client, prompt, max_tokens, ids)
            samples[ids[0]] = (time.perf_counter() - start) * 1000
    return samples


def engine_latencies(log) -> dict[str, float]:
    """The server's own arrival-to-finish latency per request, from its JSON access log."""
    log.seek(0)
    found = {}
    for line in log.read().splitlines():
        if '"event": "request"' in line:
            record = json.loads(line[line.index("{") :])
            found[record["id"]] = record["latency_s"] * 1000
    return found


def offline_latencies(llm: LLM, prompt: list[int], max_tokens: int, runs: int) -> list[float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompt, params)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        llm.generate(prompt, params)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    run = results.Run.start("server_throughput")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-runs", type=int, default=30)
    results.add_argument(parser)
    args = parser.parse_args()

    llm = LLM(MODEL, **ENGINE_ARGS)
    requests = workload(llm.tokenizer, args.requests, args.seed)
    prompt, short = requests[0][0][:32], 16
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in requests]
    start = time.perf_counter()
    llm.generate([p for p, _ in requests], params)
    offline_s = time.perf_counter() - start
    produced = sum(m for _, m in requests)
    offline = {
        "elapsed_s": round(offline_s, 2),
        "output_tokens_per_s": round(produced / offline_s, 2),
    }
    offline_ms = offline_latencies(llm, prompt, short, args.latency_runs)
    del llm  # the server loads its own copy

    flags = [f"--{k.replace('_', '-')}" for k in ENGINE_ARGS]
    values = [str(v) for v in ENGINE_ARGS.values()]
    proc, base = start_server(*[x for pair in zip(flags, values, strict=True) for x in pair])
    try:
        http = asyncio.run(http_throughput(base, requests))
        by_id = asyncio.run(http_latencies(base, prompt, short, args.latency_runs))
        in_engine = engine_latencies(proc.log)
    finally:
        stop_server(proc)

    http_ms = list(by_id.values())
    overhead = [by_id[i] - in_engine[i] for i in by_id if i in in_engine]
    p50_offline, p50_http = statistics.median(offline_ms), statistics.median(http_ms)
    result = {
        "model": MODEL,
        "workload": {"requests": len(requests), "requested_output_tokens": produced},
        "offline": offline,
        "http_streaming": http,
        "throughput_ratio": round(http["output_tokens_per_s"] / offline["output_tokens_per_s"], 3),
        "throughput_ratio_target": 0.9,
        "single_request": {
            "prompt_tokens": len(prompt),
            "output_tokens": short,
            "runs": args.latency_runs,
            "offline_p50_ms": round(p50_offline, 2),
            "http_p50_ms": round(p50_http, 2),
            "added_p50_ms": round(p50_http - p50_offline, 2),
            # The same requests' client-side latency minus the engine's own arrival-to-finish
            # time from the access log: what HTTP, parsing and SSE add, free of step noise.
            "http_overhead_p50_ms": round(statistics.median(overhead), 2),
            "http_overhead_max_ms": round(max(overhead), 2),
            "added_p50_ms_target": 2.0,
        },
    }
    print(json.dumps(result, indent=2))
    if args.record:
        single, rate = result["single_request"], "output_tokens_per_s"
        figures = [
            results.figure("mixed workload", "tok/s", http[rate], result["offline"][rate]),
            results.figure(
                "one short request, p50", "ms", single["http_p50_ms"], single["offline_p50_ms"]
            ),
            results.figure("HTTP overhead per request, p50", "ms", single["http_overhead_p50_ms"]),
        ]
        run.record(figures, "the offline API (LLM.generate), same run", result)


if __name__ == "__main__":
    main()
