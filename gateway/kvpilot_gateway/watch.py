"""The watches that feed the catalog: ModelDeployments, and the model server pods the operator
made for them (selected by its managed-by label, server side). List, then watch from the list's
resourceVersion; when a watch breaks (410 Gone after a long disconnect, the API server
restarting), list again and replace what that list covers, so nothing deleted meanwhile
lingers. Nothing is polled."""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import Pod

from kvpilot_common.kube import ModelDeploymentResource
from kvpilot_common.naming import MANAGED_BY
from kvpilot_gateway.catalog import Catalog

log = logging.getLogger("kvpilot.gateway")
RELIST_SECONDS = 1.0  # after a broken watch: soon, but not in a tight loop against a sick server


class Watches:
    """Start with start(); `synced` is set once every first list has landed (the gateway is
    ready then: before it, an unknown model might only be unlisted yet)."""

    def __init__(self, client: AsyncClient, catalog: Catalog, namespaces: tuple[str, ...]):
        self.client, self.catalog = client, catalog
        self.namespaces = namespaces or (ALL_NS,)
        self.tasks: list[asyncio.Task] = []
        self._pending = 2 * len(self.namespaces)
        self.synced = asyncio.Event()

    def start(self) -> None:
        for namespace in self.namespaces:
            self.tasks.append(asyncio.create_task(self._models(namespace)))
            self.tasks.append(asyncio.create_task(self._pods(namespace)))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _listed(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self.synced.set()

    async def _models(self, namespace: str) -> None:
        def replace(items: list[dict]) -> None:
            self.catalog.replace(_scope(namespace), mds=items)

        def event(kind: str, obj: dict) -> None:
            meta = obj["metadata"]
            if kind == "DELETED":
                self.catalog.drop_model(meta["namespace"], meta["name"])
            else:
                self.catalog.set_model(obj)

        await self._follow(ModelDeploymentResource, namespace, None, replace, event)

    async def _pods(self, namespace: str) -> None:
        def replace(items: list[dict]) -> None:
            self.catalog.replace(_scope(namespace), pods=items)

        def event(kind: str, obj: dict) -> None:
            meta = obj["metadata"]
            if kind == "DELETED":
                self.catalog.drop_pod(meta["namespace"], meta["name"])
            else:
                self.catalog.set_pod(obj)

        # Only the model servers' pods, not every pod in the cluster.
        labels: LabelSelector = {MANAGED_BY[0]: MANAGED_BY[1]}
        await self._follow(Pod, namespace, labels, replace, event)

    async def _follow(
        self,
        resource: Any,
        namespace: str,
        labels: LabelSelector | None,
        replace: Callable[[list[dict]], None],
        event: Callable[[str, dict], None],
    ) -> None:
        first = True
        while True:
            try:
                listing = self.client.list(resource, namespace=namespace, labels=labels)
                replace([_plain(obj) async for obj in listing])
                if first:
                    first = False
                    self._listed()
                version = listing.resourceVersion
                watch = self.client.watch(
                    resource, namespace=namespace, labels=labels, resource_version=version
                )
                async for kind, obj in watch:
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        event(kind, _plain(obj))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any break: list again, the catalog stays as it was meanwhile
                log.warning("watch of %s broke (%s); listing again", resource.__name__, exc)
            await asyncio.sleep(RELIST_SECONDS)


def _scope(namespace: str) -> str | None:
    return None if namespace == ALL_NS else namespace


def _plain(obj: Any) -> dict:
    return obj if isinstance(obj, dict) else obj.to_dict()
