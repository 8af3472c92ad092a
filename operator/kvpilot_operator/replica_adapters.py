"""Which adapters each ready replica has loaded, as the replicas say in their own /metrics
(kvpilot_lora_adapter_loaded): status.loadedAdapters. Read only for a ModelDeployment with
spec.adapters, and again within seconds while some ready replica lacks one of them (the kubelet
refreshes the list in each pod on its own schedule), not only at the daemon's slow resync."""

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names
from kvpilot_common.naming import PORT
from kvpilot_operator import children
from kvpilot_operator.spec import Spec

SCRAPE_TIMEOUT_S = 2.0
CONVERGING_SECONDS = 10.0  # how soon to look again while replicas and the spec differ


def parse(text: str) -> list[str]:
    found = []
    for family in text_string_to_metric_families(text):
        if family.name == metric_names.LORA_LOADED:
            found += [s.labels["adapter"] for s in family.samples if s.value]
    return sorted(found)


async def loaded(pods: list[dict]) -> list[dict]:
    """[{replica, adapters}] for the ready pods that answered, by pod name."""

    async def one(client: httpx.AsyncClient, pod: dict) -> dict | None:
        try:
            response = await client.get(f"http://{pod['status']['podIP']}:{PORT}/metrics")
            response.raise_for_status()
            return {"replica": pod["metadata"]["name"], "adapters": parse(response.text)}
        except (httpx.HTTPError, KeyError, ValueError):
            return None

    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
        found = await asyncio.gather(*(one(client, p) for p in pods if children.ready(p)))
    return sorted((f for f in found if f is not None), key=lambda f: f["replica"])


def converged(spec: Spec, found: list[dict]) -> bool:
    wanted = {a.name for a in spec.adapters}
    return all(wanted <= set(replica["adapters"]) for replica in found)
