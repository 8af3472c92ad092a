"""The Kubernetes API stand-in: kmock 0.8's KubernetesEmulator with what a real `kopf run` needs.

kmock stores bodies verbatim and merges patches naively, so every write is computed here (create
metadata, merge or JSON patch, subresource rules) and handed to kmock as a full body or an exact
diff. What each fix is for is said where it is made. Test-side writes go over HTTP too: editing
`emu.objects` directly skips these fixes and sends no watch events.
"""

import asyncio
import copy
import datetime
import itertools
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock import KubernetesEmulator, KubernetesError, KubernetesObjectNotFoundError, ResourceInfo
from kmock._internal import parsing  # private, but the only place to fix the path parser

CREATE, UPDATE, DELETE = kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE
# Set by the server only; a client's values are ignored.
SERVER_FIELDS = {"uid", "creationTimestamp", "namespace", "name", "resourceVersion", "generation"}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}  # kopf needs all of these
RESOURCES = {  # resource -> (kind, namespaced, subresources): what discovery shows
    "kvpilot.dev/v1alpha1/modeldeployments": ("ModelDeployment", True, {"status", "scale"}),
    "apps/v1/deployments": ("Deployment", True, {"status", "scale"}),
    "v1/services": ("Service", True, {"status"}),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, {"status"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
}
_original_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    # kmock answers 500 on /api/v1/namespaces and reads /api/v1/namespaces/NAME as a namespace.
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        name = parts[3] if len(parts) == 4 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name)
    return _original_parse_path(path)


parsing.parse_path = _parse_path


def _merge(old: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (kmock's refuses to replace a dict by a scalar)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(old) if isinstance(old, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _selector(expr: str | None) -> Callable[[dict], bool]:
    """Equality-based label selectors (a=b, a==b, a!=b, a, !a); kmock ignores them."""
    terms = [t.strip() for t in (expr or "").split(",") if t.strip()]

    def match(obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for term in terms:
            if "!=" in term:
                key, value = term.split("!=", 1)
                ok = labels.get(key.strip()) != value.strip()
            elif "=" in term:
                key, value = term.replace("==", "=").split("=", 1)
                ok = labels.get(key.strip()) == value.strip()
            else:
                ok = term[1:] not in labels if term.startswith("!") else term in labels
            if not ok:
                return False
        return True

    return match


def _set(request: Any, **changes: Any) -> Any:
    # kmock finds a request's reactions by identity, so the frozen request is edited in place.
    for name, value in changes.items():
        object.__setattr__(request, name, value)
    return request


def _find(container: Any, key: Any) -> Any:
    return container[key] if key in container else None  # noqa: SIM401 - kmock's have no get()


def _rv(obj: dict) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


def _spec_part(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(KubernetesEmulator):
    _counter: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    watched: list[Any] = attrs.field(factory=list, init=False)  # resources someone has watched

    async def __call__(self, raw_request: Any) -> Any:
        # kmock matches each request against its reactions by walking the whole request log, so
        # a long log makes every request slower (O(n)); keep only the recent part of it.
        if len(self._requests) > 32:
            del self._requests[:-4]
            for payload in self._payloads:  # each reaction keeps its own log too
                del payload._requests[:-4]
        response = await super().__call__(raw_request)
        # The API server says a bare "application/json"; lightkube reads errors only then.
        if not response.prepared and response.content_type == "application/json":
            response.charset = None
        return response

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.method == kmock.method.PUT and request.name:
            _set(request, action=UPDATE)  # kmock routes PUT nowhere (404)
        if request.resource is None or request.action not in (CREATE, UPDATE, DELETE):
            return await super()._handle(request)
        async with self._write_lock:  # compute and apply one write at a time
            request, unchanged = self._prepare_write(request)
            if unchanged is not None:  # a no-op keeps resourceVersion and sends no event
                return aiohttp.web.json_response(unchanged)
            return await super()._handle(request)

    def _prepare_write(self, request: Any) -> tuple[Any, dict | None]:
        if request.action == CREATE:
            return _set(request, data=self._created(request)), None
        if request.action == DELETE:  # kmock handles finalizers and deletionTimestamp
            return request, None
        key = (request.resource, request.namespace, request.name)
        stored = _find(self.objects, key)
        if stored is None or stored.deleted:
            raise KubernetesObjectNotFoundError()
        old = copy.deepcopy(stored.raw)  # stored dicts are shared with past watch events
        new = self._patched(request, old)
        # Metadata the server owns stays; the rest comes from the write.
        new["metadata"] = {
            **{k: v for k, v in (new.get("metadata") or {}).items() if k not in SERVER_FIELDS},
            **{k: v for k, v in (old.get("metadata") or {}).items() if k in SERVER_FIELDS},
        }
        if new == old:
            return request, old
        if _spec_part(new) != _spec_part(old):  # generation counts spec changes only
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 0) + 1
        new["metadata"]["resourceVersion"] = str(next(self._counter))
        return _set(request, data=jsonpatch.make_patch(old, new).patch), None

    def _created(self, request: Any) -> dict:
        obj, resource = dict(request.data or {}), request.resource
        # kopf.adopt() needs apiVersion and kind on the owner; kmock keeps what the client sent.
        obj["apiVersion"] = resource.group and f"{resource.group}/{resource.version}"
        obj["apiVersion"] = obj["apiVersion"] or resource.version
        obj.setdefault("kind", self._kind(resource))
        meta = obj["metadata"] = dict(obj.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):  # kopf's Events use generateName
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._counter)),
            generation=1,
            creationTimestamp=_now(),
        )
        return obj

    def _patched(self, request: Any, old: dict) -> dict:
        if request.method == kmock.method.PUT:
            new = dict(request.data)
        elif isinstance(request.data, list):  # JSON patch: kopf's finalizers, with an rv test
            try:
                new = jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                # kopf retries a 422 at once; a 500 (kmock's answer) only after a long backoff.
                raise KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        else:  # merge patch; strategic merge is approximated the same way
            new = _merge(old, request.data or {})
        info = _find(self.resources, request.resource)
        if request.subresource == "status":  # /status writes only .status
            status = new.get("status")
            return _merge(old, {"status": status}) if status is not None else dict(old)
        if info is not None and "status" in info.subresources:  # and nothing else does
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        return new

    def _kind(self, resource: Any) -> str:
        info = _find(self.resources, resource)
        return (info.kind if info else None) or resource.plural.capitalize()

    async def _serve_list(self, request: Any) -> Any:
        # Lists lack kind, apiVersion and a resourceVersion, and ignore labelSelector.
        result = await super()._serve_list(request)
        resource, match = request.resource, _selector(request.params.get("labelSelector"))
        result["items"] = [o for o in result["items"] if match(o)]
        result["kind"] = f"{self._kind(resource)}List"
        result["apiVersion"] = (
            f"{resource.group}/{resource.version}" if resource.group else resource.version
        )
        newest = max([_rv(o.raw) for o in self.objects.values() if not o.deleted] or [0])
        result["metadata"] = {"resourceVersion": str(newest)}
        return result

    async def _serve_watch(self, request: Any) -> Any:
        # kmock subscribes only after replaying current objects (writes in between are lost) and
        # ignores labelSelector and resourceVersion.
        self.watched.append(request.resource)  # compares equal to "group/version/plural"
        yield b""  # flush the headers
        match, bus = _selector(request.params.get("labelSelector")), self._buses[request.resource]
        since = request.params.get("resourceVersion", "")
        since = int(since) if since.isdigit() else 0

        def wanted(obj: dict) -> bool:
            namespace = (obj.get("metadata") or {}).get("namespace")
            return request.namespace in (None, namespace) and match(obj)

        mark = await bus.mark()  # subscribe first, then take the snapshot
        try:
            async with self._lock:
                snapshot = [
                    o.raw
                    for (resource, _, _), o in self.objects.items()
                    if resource == request.resource and not o.deleted
                ]
            for obj in snapshot:
                if wanted(obj) and _rv(obj) > since:
                    yield {"type": "ADDED", "object": obj}
            async for event in bus.stream(since=mark):
                if wanted(event["object"]):
                    yield event
        finally:
            await bus.unmark(mark)


def make_emulator(namespaces: tuple[str, ...] = ("default",)) -> Emulator:
    emulator = Emulator()
    for resource, (kind, namespaced, subresources) in RESOURCES.items():
        emulator.resources[resource] = ResourceInfo(
            kind=kind,
            singular=kind.lower(),
            namespaced=namespaced,
            verbs=VERBS,
            subresources=subresources,
        )
    for namespace in namespaces:  # kopf -n NS serves only namespaces that exist
        meta = {"name": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "0"}
        emulator.objects["v1/namespaces", None, namespace] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {**meta, "creationTimestamp": _now()},
        }
    return emulator
