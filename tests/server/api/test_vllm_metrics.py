"""The vLLM-named series on /metrics agree with kvpilot's own, scraped from a live server while
requests run, so an endpoint picker or KEDA reading vLLM's names sees the same state."""

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names

# More concurrent long requests than the server runs at once, so some wait: both sums are
# checked with values other than zero.
LONG = {"model": "tiny", "prompt": "The river", "max_tokens": 100, "ignore_eos": True}
CONCURRENT = 4


@pytest.fixture(scope="module")
def two_seq_server(server_pool, tiny_dir):
    # test_context_policy.py's server (one start for both): truncation never touches prompts
    # that fit, as these do.
    flags = ("--context-overflow", "truncate-oldest", "--max-num-seqs", "2")
    with server_pool.tiny(tiny_dir("llama"), *flags) as server:
        yield server.base


def _scrape(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _total(samples: dict, name: str) -> float:
    return sum(value for _, value in samples[name])


def _only(samples: dict, name: str) -> tuple[dict[str, str], float]:
    (series,) = samples[name]  # the endpoint picker reads a single series per name
    return series


def _assert_agree(samples: dict) -> None:
    for vllm, ours in [
        (names.VLLM_REQUESTS_WAITING, names.REQUESTS_WAITING),
        (names.VLLM_REQUESTS_RUNNING, names.REQUESTS_RUNNING),
        (names.VLLM_KV_CACHE_USAGE, names.KV_CACHE_USAGE),
    ]:
        labels, value = _only(samples, vllm)
        assert labels == {"model_name": "tiny", "engine": "0"}
        assert value == _total(samples, ours), vllm
    assert 0.0 <= _only(samples, names.VLLM_KV_CACHE_USAGE)[1] <= 1.0
    info_labels, info_value = _only(samples, names.VLLM_CACHE_CONFIG_INFO)
    engine_labels, _ = _only(samples, names.ENGINE_INFO)
    assert info_value == 1.0
    assert info_labels["block_size"] == engine_labels["block_size"]
    assert info_labels["num_gpu_blocks"] == engine_labels["num_blocks"]
    assert int(info_labels["num_gpu_blocks"]) > 0


def test_vllm_series_equal_kvpilot_series_while_requests_run(two_seq_server):
    async def load_and_scrape() -> list[dict]:
        async with httpx.AsyncClient(base_url=two_seq_server, timeout=120) as client:
            requests = [
                asyncio.create_task(client.post("/v1/completions", json=LONG))
                for _ in range(CONCURRENT)
            ]
            scrapes = []
            while not all(r.done() for r in requests):
                # Every scrape must agree; the busy ones are what make the check worth anything.
                scrapes.append(_scrape((await client.get("/metrics")).text))
                await asyncio.sleep(0.02)  # leave the server's event loop to the requests
            assert all(r.status_code == 200 for r in await asyncio.gather(*requests))
            scrapes.append(_scrape((await client.get("/metrics")).text))
            return scrapes

    scrapes = asyncio.run(load_and_scrape())
    for samples in scrapes:
        _assert_agree(samples)
    busy = [s for s in scrapes if _only(s, names.VLLM_REQUESTS_RUNNING)[1] >= 1]
    assert busy, "no scrape saw a running request"
    assert any(_only(s, names.VLLM_KV_CACHE_USAGE)[1] > 0 for s in busy)
    assert any(_only(s, names.VLLM_REQUESTS_WAITING)[1] >= 1 for s in scrapes)
    assert _only(scrapes[-1], names.VLLM_REQUESTS_RUNNING)[1] == 0
    assert _only(scrapes[-1], names.VLLM_REQUESTS_WAITING)[1] == 0
