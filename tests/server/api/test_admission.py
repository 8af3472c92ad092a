"""Overload gets a fast 429 with Retry-After, admitted requests finish, deadlines answer 408."""

import asyncio
import time

import httpx
import pytest


@pytest.fixture(scope="module")
def small_server(server_pool, tiny_dir):
    with server_pool.tiny(tiny_dir("llama"), "--max-num-seqs", "2", "--max-waiting", "2") as server:
        yield server.base


def test_excess_load_gets_429_with_retry_after(small_server):
    body = {"model": "tiny", "prompt": "The river", "max_tokens": 60, "ignore_eos": True}

    async def offered_load():
        async with httpx.AsyncClient(base_url=small_server, timeout=120) as client:

            async def one():
                start = time.monotonic()
                response = await client.post("/v1/completions", json=body)
                return response, time.monotonic() - start

            return await asyncio.gather(*(one() for _ in range(12)))

    results = asyncio.run(offered_load())
    refused = [(r, t) for r, t in results if r.status_code == 429]
    served = [r for r, _ in results if r.status_code == 200]
    assert len(refused) >= 6 and len(served) >= 2 and len(refused) + len(served) == 12
    for response, elapsed in refused:
        assert int(response.headers["Retry-After"]) >= 1 and elapsed < 5.0
        assert response.json()["error"]["type"] == "rate_limit_error"
    assert all(r.json()["usage"]["completion_tokens"] == 60 for r in served)
    assert httpx.get(f"{small_server}/health").status_code == 200


def test_request_timeout_answers_408_and_frees_the_slot(small_server):
    body = {
        "model": "tiny",
        "prompt": "The river",
        "max_tokens": 200,
        "ignore_eos": True,
        "timeout": 0.2,
    }
    response = httpx.post(f"{small_server}/v1/completions", json=body, timeout=60)
    assert (
        response.status_code == 408
        and "timed out after 0.2 s" in response.json()["error"]["message"]
    )
    quick = httpx.post(f"{small_server}/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert quick.status_code == 200
