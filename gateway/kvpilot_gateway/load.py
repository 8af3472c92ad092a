"""Replicas' load for routing: their own /metrics, scraped about every second, combined with this
gateway's requests in flight to each (known at once, where a scrape lags). The caller runs the
scrape loop; nothing here sleeps or keeps time."""

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names

# A replica whose KV cache is this full has no room for another request's blocks: a new request
# waits for running ones to finish, or preempts one and its prefill is computed again.
KV_NEARLY_FULL = 0.95


@dataclass(frozen=True)
class Load:
    """One scrape of a kvpilot server's /metrics."""

    waiting: float  # requests queued, every class
    running: float  # requests in the running batch, every class
    kv_usage: float  # fraction of KV blocks held by requests (cached free blocks not counted)
    adapters: frozenset[str] = frozenset()  # LoRA adapters in the engine's slots now
    slots: int = 0  # the engine's LoRA slots (0: it serves none)
    context: int = 0  # the engine's max_model_len (0: not reported): what an answer may reach


def parse_load(text: str) -> Load:
    """Raises ValueError on text that is not the Prometheus exposition format."""
    waiting = running = kv_usage = 0.0
    adapters, slots, context = set(), 0, 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == names.LORA_RESIDENT and s.value:
                adapters.add(s.labels["adapter"])
            elif s.name == names.LORA_SLOTS:
                slots = int(s.value)
            elif s.name == names.REQUESTS_WAITING:
                waiting += s.value  # summed over the `class` label
            elif s.name == names.REQUESTS_RUNNING:
                running += s.value
            elif s.name == names.KV_CACHE_USAGE:
                kv_usage = max(kv_usage, s.value)
            elif s.name == names.ENGINE_INFO and s.labels.get("max_model_len", "").isdigit():
                context = int(s.labels["max_model_len"])
    return Load(waiting, running, kv_usage, frozenset(adapters), slots, context)


@dataclass
class _State:
    scraped: Load | None = None
    in_flight: int = 0
    down: bool = False


class Loads:
    """Per endpoint: the last scrape, this gateway's own in-flight count, and whether it is down.
    An endpoint never heard of counts as up and idle: a replica just made ready is routable
    before its first scrape."""

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}

    def _state(self, endpoint: str) -> _State:
        return self._states.setdefault(endpoint, _State())

    def begin(self, endpoint: str) -> None:
        self._state(endpoint).in_flight += 1

    def end(self, endpoint: str) -> None:
        state = self._states.get(endpoint)
        if state is not None:  # forgotten by keep_only while the request ran: nothing to count
            state.in_flight = max(0, state.in_flight - 1)

    def update(self, endpoint: str, load: Load | None) -> None:
        """A scrape's result; None (it failed) marks the endpoint down, an answer brings it up."""
        state = self._state(endpoint)
        if load is None:
            state.down = True
        else:
            state.scraped, state.down = load, False

    def scraped(self, endpoint: str) -> Load | None:
        state = self._states.get(endpoint)
        return None if state is None else state.scraped

    def mark_down(self, endpoint: str) -> None:
        """A request could not connect: down until a scrape answers again."""
        self._state(endpoint).down = True

    def is_down(self, endpoint: str) -> bool:
        state = self._states.get(endpoint)
        return state is not None and state.down

    def in_flight(self, endpoint: str) -> int:
        state = self._states.get(endpoint)
        return 0 if state is None else state.in_flight

    def load(self, endpoint: str) -> float:
        state = self._states.get(endpoint)
        if state is None:
            return 0.0
        # The larger of the two: the scrape sees other gateways' requests and direct clients,
        # the in-flight count sees this gateway's requests sent since the last scrape.
        scraped = state.scraped
        queued = 0.0 if scraped is None else scraped.waiting + scraped.running
        load = max(float(state.in_flight), queued)
        if scraped is not None and scraped.kv_usage >= KV_NEARLY_FULL:
            # Its queue understates it: the next request there waits for blocks or evicts a
            # running one, so it counts double, and plus one so that it does even when idle.
            load = 2 * load + 1
        return load

    def snapshot(self) -> dict[str, dict]:
        """Every known endpoint's state, for a debug view or metrics."""
        return {
            endpoint: {
                "waiting": None if s.scraped is None else s.scraped.waiting,
                "running": None if s.scraped is None else s.scraped.running,
                "kv_usage": None if s.scraped is None else s.scraped.kv_usage,
                "in_flight": s.in_flight,
                "down": s.down,
                "load": self.load(endpoint),
            }
            for endpoint, s in sorted(self._states.items())
        }

    def keep_only(self, endpoints: Iterable[str]) -> None:
        """Forget endpoints that are gone."""
        alive = set(endpoints)
        for endpoint in [e for e in self._states if e not in alive]:
            del self._states[endpoint]


async def scrape(client: aiohttp.ClientSession, endpoints: Iterable[str], loads: Loads) -> None:
    """One pass: GET every endpoint's /metrics at once (the session's timeout bounds each) and
    record the answers; an endpoint that fails to answer is marked down."""

    async def one(endpoint: str) -> None:
        try:
            async with client.get(f"http://{endpoint}/metrics") as response:
                response.raise_for_status()
                load = parse_load(await response.text())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            load = None
        loads.update(endpoint, load)

    await asyncio.gather(*(one(e) for e in set(endpoints)))
