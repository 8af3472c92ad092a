"""One resumable stream's moves from replica to replica (resume.py says what a move sends):
which replica takes it next (a ready one not tried yet, by the balancer, as the first was
picked), the load counted on whichever replica holds it now, and a resume metric by reason."""

import aiohttp

from kvpilot_gateway import resume
from kvpilot_gateway.catalog import Model
from kvpilot_gateway.headers import for_endpoint
from kvpilot_gateway.proxy import UPSTREAM_ERRORS, UpstreamTimeout, open_upstream
from kvpilot_gateway.state import State

Headers = list[tuple[bytes, bytes]]


class Failover:
    def __init__(
        self,
        state: State,
        model: Model,
        key: bytes | None,
        path: str,
        body: bytes,
        headers: Headers,
        endpoint: str,
    ) -> None:
        self.state, self.model, self.key, self.path = state, model, key, path
        self.body, self.headers = body, headers
        self.current: str | None = endpoint  # the replica whose load this stream counts in
        self.tried = {endpoint}

    def end(self) -> None:
        """The stream is over: its replica's load drops."""
        if self.current is not None:
            self.state.loads.end(self.current)
            self.current = None

    async def __call__(self, tracker: resume.Tracker, reason: str) -> aiohttp.ClientResponse | None:
        state, settings = self.state, self.state.settings
        state.metrics.resumes.labels(*self.model.key, reason).inc()
        if self.current is not None:
            state.loads.mark_down(self.current)  # until a scrape hears from it again
        self.end()
        if tracker.id is None:  # nothing reached the client: the request as it was
            body, headers = self.body, self.headers
        else:
            # The headers carry the gateway secret already (headers.from_gateway).
            body, headers = resume.with_fields(self.body, tracker.continuation()), self.headers
        for _ in range(settings.retries + 1):
            endpoints = [e for e in state.usable(self.model) if e not in self.tried]
            if not endpoints:
                return None
            load = {e: state.loads.load(e) for e in endpoints}
            endpoint = state.balancer.pick(endpoints, load, self.key).endpoint
            self.tried.add(endpoint)
            state.loads.begin(endpoint)
            assert state.client is not None
            try:
                sent = for_endpoint(headers, endpoint, settings.gateway_secret)
                upstream = await open_upstream(
                    state.client, endpoint, self.path, body, sent, settings.upstream_timeout
                )
            except (UpstreamTimeout, *UPSTREAM_ERRORS):
                state.loads.end(endpoint)
                state.loads.mark_down(endpoint)
                continue
            if upstream.status != 200:
                upstream.close()
                state.loads.end(endpoint)
                continue
            self.current = endpoint
            return upstream
        return None
