"""Replicas' load: parsing a real server's /metrics, scraping live and dead endpoints, and how
scrapes, in-flight counts and failures combine."""

import asyncio

import aiohttp
import httpx
import pytest
from aiohttp import web

from kvpilot_common import metric_names as names
from kvpilot_gateway.load import Load, Loads, parse_load, scrape

DEAD = "127.0.0.1:1"  # nothing listens on port 1: the connection is refused at once


def endpoint_of(base: str) -> str:
    return base.removeprefix("http://")


def test_parse_a_live_servers_metrics(tiny_server):
    text = httpx.get(f"{tiny_server}/metrics", timeout=10.0).text
    assert names.REQUESTS_WAITING in text and names.KV_CACHE_USAGE in text
    load = parse_load(text)
    assert load.waiting == 0.0
    assert load.running == 0.0
    assert 0.0 <= load.kv_usage <= 1.0
    assert load.context == 256  # the tiny server's --max-model-len: a chat's most


def test_scrape_marks_the_live_endpoint_up_and_the_dead_one_down(tiny_server):
    live = endpoint_of(tiny_server)
    loads = Loads()
    loads.mark_down(live)  # a failed request earlier; the scrape's answer brings it back

    async def one_pass() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as client:
            await scrape(client, [live, DEAD], loads)

    asyncio.run(one_pass())
    assert not loads.is_down(live)
    assert loads.is_down(DEAD)
    assert loads.load(live) == 0.0
    snapshot = loads.snapshot()
    assert snapshot[live]["waiting"] == 0.0 and snapshot[live]["down"] is False
    assert snapshot[DEAD] == {
        "waiting": None,
        "running": None,
        "kv_usage": None,
        "in_flight": 0,
        "down": True,
        "load": 0.0,
    }


def test_parse_sums_classes():
    text = (
        f"# TYPE {names.REQUESTS_WAITING} gauge\n"
        f'{names.REQUESTS_WAITING}{{class="interactive"}} 3\n'
        f'{names.REQUESTS_WAITING}{{class="batch"}} 4\n'
        f"# TYPE {names.REQUESTS_RUNNING} gauge\n"
        f'{names.REQUESTS_RUNNING}{{class="interactive"}} 2\n'
        f'{names.REQUESTS_RUNNING}{{class="batch"}} 1\n'
        f"# TYPE {names.KV_CACHE_USAGE} gauge\n"
        f"{names.KV_CACHE_USAGE} 0.5\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting 7\n"
    )
    assert parse_load(text) == Load(waiting=7.0, running=3.0, kv_usage=0.5)


def test_parse_rejects_what_is_not_metrics():
    with pytest.raises(ValueError):
        parse_load("<html>not found</html>\n")


def test_scrape_of_an_answer_that_is_not_metrics_marks_down():
    """A real HTTP server on loopback answering a 500 on one port and a login page on another."""

    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=500, text="oops")

    async def login_page(_: web.Request) -> web.Response:
        return web.Response(text="<html>a login page</html>\n", content_type="text/html")

    loads = Loads()

    async def one_pass() -> list[str]:
        runners, endpoints = [], []
        for handler in (broken, login_page):
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            runners.append(runner)
            endpoints.append(f"127.0.0.1:{port}")
        try:
            async with aiohttp.ClientSession() as client:
                await scrape(client, endpoints, loads)
        finally:
            for runner in runners:
                await runner.cleanup()
        return endpoints

    for endpoint in asyncio.run(one_pass()):
        assert loads.is_down(endpoint)


# -- Loads -------------------------------------------------------------------------------------


def test_unknown_endpoint_is_up_and_idle():
    loads = Loads()
    assert not loads.is_down("a:1")
    assert loads.load("a:1") == 0.0
    assert loads.in_flight("a:1") == 0
    loads.end("a:1")  # an end with no begin changes nothing
    assert loads.in_flight("a:1") == 0


def test_in_flight_counts_at_once_and_never_below_zero():
    loads = Loads()
    loads.update("a:1", Load(waiting=0.0, running=0.0, kv_usage=0.1))
    for _ in range(3):
        loads.begin("a:1")
    assert loads.in_flight("a:1") == 3
    assert loads.load("a:1") == 3.0  # the scrape has not seen them yet
    for _ in range(5):
        loads.end("a:1")
    assert loads.in_flight("a:1") == 0
    assert loads.load("a:1") == 0.0


def test_load_is_the_larger_of_scrape_and_in_flight():
    loads = Loads()
    loads.update("a:1", Load(waiting=4.0, running=2.0, kv_usage=0.3))
    loads.begin("a:1")
    assert loads.load("a:1") == 6.0  # others' requests, seen by the scrape
    for _ in range(7):
        loads.begin("a:1")
    assert loads.load("a:1") == 8.0  # ours, sent since the scrape


def test_nearly_full_kv_cache_counts_as_more_loaded():
    loads = Loads()
    loads.update("full:1", Load(waiting=0.0, running=3.0, kv_usage=0.97))
    loads.update("roomy:1", Load(waiting=0.0, running=3.0, kv_usage=0.94))
    assert loads.load("roomy:1") == 3.0
    assert loads.load("full:1") == 7.0
    loads.update("full:1", Load(waiting=0.0, running=0.0, kv_usage=0.95))
    assert loads.load("full:1") == 1.0


def test_down_until_a_scrape_answers():
    loads = Loads()
    loads.update("a:1", Load(1.0, 1.0, 0.2))
    loads.mark_down("a:1")
    assert loads.is_down("a:1")
    loads.update("a:1", None)  # the scrape failed too
    assert loads.is_down("a:1")
    assert loads.load("a:1") == 2.0  # the last answer is kept for when it comes back
    loads.update("a:1", Load(0.0, 1.0, 0.2))
    assert not loads.is_down("a:1")
    assert loads.load("a:1") == 1.0


def test_keep_only_forgets_gone_endpoints():
    loads = Loads()
    for endpoint in ("a:1", "b:1", "c:1"):
        loads.update(endpoint, None)
        loads.begin(endpoint)
    loads.keep_only(["b:1", "z:1"])
    assert set(loads.snapshot()) == {"b:1"}
    assert not loads.is_down("a:1") and loads.in_flight("a:1") == 0
    loads.end("a:1")  # a request that was running on it finishes later: no trace left
    assert "a:1" not in loads.snapshot()
    assert loads.in_flight("b:1") == 1
