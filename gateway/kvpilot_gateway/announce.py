"""Telling the operator how many requests this gateway holds for a model: the held-requests
annotation (kvpilot_common.demand), written by server-side apply under this gateway's own field
manager, so replicas of the gateway never overwrite one another and the operator's watch
delivers it at once.

One writer task per model while its count moves: the first write goes out at once (waking a
model is the latency a user feels), later ones are coalesced (a burst of arrivals is one write
per interval, not one per request), and while requests stay held the entry is refreshed so the
operator can tell a live gateway's demand from a dead one's.
"""

import asyncio
import logging
import time

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from kvpilot_common import demand, naming
from kvpilot_common.kube import ModelDeploymentResource
from kvpilot_gateway.catalog import Key

log = logging.getLogger("kvpilot.gateway")
COALESCE_SECONDS = 0.25
RETRY_SECONDS = 1.0


class Announcer:
    def __init__(self, client: AsyncClient, gateway_id: str) -> None:
        self.client = client
        self.key = demand.annotation_key(gateway_id)
        self.manager = f"kvpilot-gateway-{self.key.removeprefix(demand.PREFIX)}"[:128]
        self.counts: dict[Key, int] = {}
        self._dirty: dict[Key, asyncio.Event] = {}
        self._tasks: dict[Key, asyncio.Task] = {}
        self.writes = 0  # for tests and the benchmark: writes are what this costs the API server

    def set(self, model: Key, held: int) -> None:
        self.counts[model] = held
        self._dirty.setdefault(model, asyncio.Event()).set()
        if model not in self._tasks:
            self._tasks[model] = asyncio.create_task(self._run(model))

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _run(self, model: Key) -> None:
        dirty = self._dirty[model]
        written: int | None = None
        written_at = 0.0
        try:
            while True:
                dirty.clear()
                held = self.counts.get(model, 0)
                due = held > 0 and time.monotonic() - written_at >= demand.REFRESH_SECONDS
                if held != written or due:
                    if not await self._write(model, held):
                        await asyncio.sleep(RETRY_SECONDS)
                        continue
                    written, written_at = held, time.monotonic()
                if held == 0:
                    return
                try:
                    await asyncio.wait_for(dirty.wait(), demand.REFRESH_SECONDS)
                except TimeoutError:
                    continue
                await asyncio.sleep(COALESCE_SECONDS)
        except asyncio.CancelledError:
            raise
        finally:
            self._tasks.pop(model, None)
            if self.counts.get(model) == 0:
                self.counts.pop(model, None)

    async def _write(self, model: Key, held: int) -> bool:
        """False: try again shortly. A ModelDeployment that is gone needs no more writes."""
        namespace, name = model
        body = {
            "apiVersion": f"{naming.GROUP}/{naming.VERSION}",
            "kind": naming.KIND,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {self.key: demand.encode(held, time.time())},
            },
        }
        try:
            await self.client.patch(
                ModelDeploymentResource,
                name,
                body,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager=self.manager,
            )
        except ApiError as exc:
            # Gone: an apply to a missing ModelDeployment would create it, which fails its
            # schema (422; the gateway may not create anyway). Nothing to report any more.
            if exc.status.code in (404, 422):
                log.warning("stopped reporting held requests for %s/%s: %s", *model, exc)
                self.counts[model] = 0
                return True
            log.warning("cannot report %d held requests for %s/%s: %s", held, *model, exc)
            return False
        except Exception as exc:  # the API server unreachable: keep the count, try again
            log.warning("cannot report %d held requests for %s/%s: %s", held, *model, exc)
            return False
        self.writes += 1
        return True
