"""The gateway without Kubernetes (`--backend MODEL=URL`): the catalog holds the named models,
each served by its listed servers, and a probe stands in for the kubelet's readiness probe and
the pod watch. Every interval it asks each server's /ready; one that answers 200 takes requests,
one that does not (starting, draining, gone) is left out until it does again. Load, routing,
retries and limits are the same code as with discovery; only scale from zero is missing (no
operator starts a server that is down), so a model with no ready server is refused with 503 at
once rather than held."""

import asyncio
import logging

import aiohttp

from kvpilot_gateway.catalog import Catalog
from kvpilot_gateway.options import Backends

log = logging.getLogger("kvpilot.gateway")
NAMESPACE = "static"  # the models' namespace here: /v1/models' owned_by, and `static/MODEL`


def model_object(model: str, servers: int) -> dict:
    """The model as the catalog reads a ModelDeployment."""
    return {
        "metadata": {"namespace": NAMESPACE, "name": model},
        "spec": {"model": {"servedModelName": model}, "replicas": servers},
    }


class Probes:
    """Start with start(); `synced` is set once every server was asked once (the gateway is
    ready then: before it, no server would count as ready)."""

    def __init__(self, catalog: Catalog, backends: Backends, interval: float) -> None:
        self.catalog, self.backends, self.interval = catalog, backends, interval
        self.synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._ready: dict[str, bool] = {}
        for model, servers in backends:
            catalog.set_model(model_object(model, len(servers)))

    def start(self) -> None:
        self._task = asyncio.create_task(self._forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _forever(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(0.5, min(2.0, self.interval)))
        async with aiohttp.ClientSession(timeout=timeout) as client:
            while True:
                await self.probe(client)
                self.synced.set()
                await asyncio.sleep(self.interval)

    async def probe(self, client: aiohttp.ClientSession) -> None:
        """One pass over every server at once."""
        endpoints = {e for _, servers in self.backends for e in servers}
        answers = await asyncio.gather(*(_ready(client, e) for e in sorted(endpoints)))
        ready = dict(zip(sorted(endpoints), answers, strict=True))
        for endpoint, now in ready.items():
            if self._ready.get(endpoint) != now:
                log.info("backend %s is %s", endpoint, "ready" if now else "not ready")
        self._ready = ready
        for model, servers in self.backends:
            for endpoint in servers:
                member = (NAMESPACE, f"{model} {endpoint}")
                self.catalog.set_member(member, model, endpoint if ready[endpoint] else None)


async def _ready(client: aiohttp.ClientSession, endpoint: str) -> bool:
    try:
        async with client.get(f"http://{endpoint}/ready") as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
