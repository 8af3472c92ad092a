"""The seed-003 scenario: short chats and long summaries at once, some streams cancelled
mid-way, one request overflowing the context. The overflow gets a clear 400, nothing else fails,
greedy outputs equal running each request alone, and the engine is idle and empty afterwards."""

import asyncio
import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names

WORDS = [
    "the",
    "river",
    "runs",
    "through",
    "the",
    "valley",
    "past",
    "farms",
    "and",
    "a",
    "stone",
    "bridge",
]


def _chat(words: int, max_tokens: int) -> dict:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Summarise: {text}"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


async def _stream(client: httpx.AsyncClient, body: dict, cancel_after: int | None) -> str | None:
    text, chunks = "", 0
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if cancel_after is not None and chunks >= cancel_after:
                return None  # leaving the block closes the connection mid-stream
    return text


def _metrics(base: str) -> dict[str, float]:
    families = text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
    values: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_mixed_load_with_cancellations_and_an_overflow(tiny_server):
    short = [_chat(5 + i, 8 + i) for i in range(6)]
    long = [_chat(100 + 10 * i, 40) for i in range(3)]
    doomed = [_chat(40, 150) for _ in range(3)]
    overflow = _chat(400, 10)

    async def scenario():
        async with httpx.AsyncClient(base_url=tiny_server, timeout=120) as client:
            tasks = [_stream(client, b, None) for b in short + long]
            tasks += [_stream(client, b, 3) for b in doomed]
            rejected = client.post("/v1/chat/completions", json=overflow)
            *texts, response = await asyncio.gather(*tasks, rejected)
            solo = [await _stream(client, b, None) for b in short + long]
        return texts, response, solo

    texts, response, solo = asyncio.run(scenario())
    assert response.status_code == 400
    assert "maximum context length is 256 tokens" in response.json()["error"]["message"]
    assert texts[: len(short) + len(long)] == solo
    assert all(t is None for t in texts[len(short) + len(long) :])

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # cancelled requests are aborted within a step or two
        values = _metrics(tiny_server)
        if values[names.REQUESTS_RUNNING] == 0:
            break
        time.sleep(0.1)
    assert values[names.KV_CACHE_USAGE] == 0.0
    assert values[names.REQUESTS_RUNNING] == 0 and values[names.REQUESTS_WAITING] == 0
    assert values[names.REQUESTS] >= 2 * (len(short) + len(long)) + len(doomed) + 1
    assert values[names.TIME_TO_FIRST_TOKEN + "_count"] >= 2 * (len(short) + len(long))
