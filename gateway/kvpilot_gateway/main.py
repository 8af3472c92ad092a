"""`kvpilot gateway`: settings from the flags, the watches (or, given --backend, the backends'
probes), the load scraper and the announcer started with the app and stopped with it, uvicorn
with the server's HTTP protocol (its header size limit and header timeout) and the server's
drain (on SIGTERM /ready fails, held requests get 503 and new ones too, while in-flight ones,
streams included, finish within the drain timeout)."""

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from lightkube import AsyncClient
from starlette.applications import Starlette

from kvpilot_common import demand
from kvpilot_gateway import options
from kvpilot_gateway.announce import Announcer
from kvpilot_gateway.app import build_app
from kvpilot_gateway.backends import Probes
from kvpilot_gateway.load import scrape
from kvpilot_gateway.state import State
from kvpilot_gateway.watch import Watches

log = logging.getLogger("kvpilot.gateway")


def run_gateway(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from kvpilot_common.errors import ConfigError
    from kvpilot_common.http.keys import load_key_book

    try:
        keys = load_key_book(args.api_key_file)
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 1
    from kvpilot_common.http.serving import draining_server, http_config

    try:
        settings = options.settings(args, keys)
    except ValueError as exc:
        log.error("cannot start: %s", exc)
        return 1
    app = create_app(settings)
    # uvicorn would otherwise believe X-Forwarded-For from loopback peers and rewrite the
    # client's address; the gateway decides whom to believe (--trusted-proxy, headers.py).
    config = http_config(app, args, proxy_headers=False)
    server = draining_server()(config, app.state.gateway, args.drain_timeout)
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when it cannot start (it logged why)
        if server.started:
            raise
        log.error("cannot listen on %s:%s", args.host, args.port)
        return 1
    return 0


def create_app(settings: options.Settings) -> Starlette:
    """With --backend: the backends' probes (backends.py), no Kubernetes client and nothing
    announced (nothing would scale from zero). Else the watches and the held-requests
    announcer."""
    kube = None if settings.backends else AsyncClient()
    announcer = Announcer(kube, settings.gateway_id) if kube is not None else None
    # The upstream session opens with the loop.
    state = State(settings, None, announcer.set if announcer else lambda key, held: None)
    source: Watches | Probes = (
        Watches(kube, state.catalog, settings.namespaces)
        if kube is not None
        else Probes(state.catalog, settings.backends, settings.scrape_interval)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # aiohttp for the replicas: its client costs measurably less per request than httpx's
        # async one (benchmarks/gateway.py), and kopf already brings it into the image. No
        # read timeout (a long completion streams for minutes; the replica has its own request
        # timeout), no connection limit (the replicas' queues are the bound), bytes as sent.
        state.client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.upstream_connect_timeout),
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
        )
        source.start()
        scraper = asyncio.create_task(_scrape_forever(state))
        ready = asyncio.create_task(_when_synced(state, source, announcer))
        try:
            yield
        finally:
            for task in (scraper, ready):
                task.cancel()
            await source.stop()
            if announcer is not None:
                await announcer.stop()
            await state.client.close()
            if kube is not None:
                await kube.close()

    app = build_app(state)
    app.router.lifespan_context = lifespan
    app.state.gateway = state  # the drain reads `draining` and `in_flight`
    return app


async def _when_synced(
    state: State, source: "Watches | Probes", announcer: Announcer | None
) -> None:
    await source.synced.wait()
    state.synced = True
    if announcer is None:
        return
    # A restarted gateway (same pod name) may have left a count of requests it no longer
    # holds: say zero now rather than let the operator count them until they go stale.
    now = time.time()
    for model in list(state.catalog.models.values()):
        mine = {k: v for k, v in model.annotations.items() if k == announcer.key}
        if demand.read(mine, now).held and model.key not in announcer.counts:
            announcer.set(model.key, 0)


async def _scrape_forever(state: State) -> None:
    """Every replica's /metrics each interval: the load the balancer weighs."""
    interval = state.settings.scrape_interval
    timeout = aiohttp.ClientTimeout(total=max(0.5, min(2.0, interval)))
    async with aiohttp.ClientSession(timeout=timeout) as client:
        while True:
            catalog = state.catalog
            endpoints = {e for m in catalog.models.values() for e in catalog.endpoints(m.key)}
            state.loads.keep_only(endpoints)
            try:
                await scrape(client, endpoints, state.loads)
            except Exception as exc:  # never let one bad pass stop routing by load
                log.warning("scrape pass failed: %r", exc)
            await asyncio.sleep(interval)
