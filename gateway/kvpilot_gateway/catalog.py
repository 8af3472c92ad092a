"""What the gateway knows of the cluster: the ModelDeployments it watches and the endpoints of
their Services, as the watches report them (watch.py feeds it). Pure: no I/O; one writer, the
event loop.

A request names a model the way clients of one server do: its served model name. The same name
in two namespaces is ambiguous, and then only `namespace/name` finds it. Endpoints come from the
Service's EndpointSlices (the endpoint controller's view of pod readiness), not from pods, so the
gateway sends traffic exactly where the Service would.
"""

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvpilot_server.errors import ModelNotFoundError

SERVICE_LABEL = "kubernetes.io/service-name"
PORT_NAME = "http"  # the model Service's port (the operator's render.py)

Key = tuple[str, str]  # (namespace, ModelDeployment name)


@dataclass
class Model:
    namespace: str
    name: str
    served: str  # the name clients send as `model`, and the server behind it answers to
    replicas: int  # spec.replicas: 0 means scaled to zero
    autoscaling: bool  # can anything wake it from zero?
    ready_replicas: int = 0  # status.readyReplicas, for /v1/models
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def qualified(self) -> str:
        return f"{self.namespace}/{self.served}"


def model_from(md: dict) -> Model:
    meta, spec = md["metadata"], md.get("spec") or {}
    served = (spec.get("model") or {}).get("servedModelName") or meta["name"]
    return Model(
        namespace=meta["namespace"],
        name=meta["name"],
        served=served,
        replicas=int(spec.get("replicas", 1)),
        autoscaling=bool((spec.get("autoscaling") or {}).get("enabled")),
        ready_replicas=int((md.get("status") or {}).get("readyReplicas") or 0),
        annotations=dict(meta.get("annotations") or {}),
    )


def endpoints_from(endpoint_slice: dict) -> tuple[str, list[str]]:
    """(service name, ready "ip:port" endpoints) of one EndpointSlice. An endpoint whose
    `ready` is unset counts as ready, as the API documents; terminating ones never do."""
    service = (endpoint_slice["metadata"].get("labels") or {}).get(SERVICE_LABEL, "")
    ports = [p.get("port") for p in endpoint_slice.get("ports") or [] if p.get("name") == PORT_NAME]
    if not ports or ports[0] is None:
        return service, []
    ready = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating"):
            continue
        ready += [f"{address}:{ports[0]}" for address in endpoint.get("addresses") or []]
    return service, ready


class Catalog:
    def __init__(self) -> None:
        self.models: dict[Key, Model] = {}
        # (namespace, slice name) -> (service, ready endpoints): a Service may have several.
        self.slices: dict[Key, tuple[str, list[str]]] = {}
        self._changed: dict[Key, asyncio.Event] = {}

    # -- the watches' side ----------------------------------------------------------------------

    def set_model(self, md: dict) -> None:
        model = model_from(md)
        self.models[model.key] = model
        self._wake(model.key)

    def drop_model(self, namespace: str, name: str) -> None:
        self.models.pop((namespace, name), None)
        self._wake((namespace, name))

    def set_slice(self, endpoint_slice: dict) -> None:
        meta = endpoint_slice["metadata"]
        service, ready = endpoints_from(endpoint_slice)
        self.slices[(meta["namespace"], meta["name"])] = (service, ready)
        self._wake((meta["namespace"], service))

    def drop_slice(self, namespace: str, name: str) -> None:
        service, _ = self.slices.pop((namespace, name), ("", []))
        self._wake((namespace, service))

    def replace(
        self,
        namespace: str | None,
        mds: Iterable[dict] | None = None,
        slices: Iterable[dict] | None = None,
    ) -> None:
        """A fresh list of one namespace (None: all) after a watch broke: what that list
        covers and does not hold is gone."""

        def covered(key: Key) -> bool:
            return namespace is None or key[0] == namespace

        if mds is not None:
            gone = {k for k in self.models if covered(k)}
            self.models = {k: m for k, m in self.models.items() if not covered(k)}
            for md in mds:
                self.set_model(md)
            for key in gone - set(self.models):
                self._wake(key)
        if slices is not None:
            services = {(k[0], s) for k, (s, _) in self.slices.items() if covered(k)}
            self.slices = {k: v for k, v in self.slices.items() if not covered(k)}
            for endpoint_slice in slices:
                self.set_slice(endpoint_slice)
            for key in services:
                self._wake(key)

    # -- the requests' side ---------------------------------------------------------------------

    def resolve(self, requested: str) -> Model:
        """The model a request names: `served name`, or `namespace/served name`."""
        namespace, _, served = requested.rpartition("/")
        found = [
            m
            for m in self.models.values()
            if m.served == served and (not namespace or m.namespace == namespace)
        ]
        if len(found) == 1:
            return found[0]
        if not found:
            raise ModelNotFoundError(f"The model {requested!r} does not exist")
        names = ", ".join(sorted(m.qualified for m in found))
        raise ModelNotFoundError(
            f"The model {requested!r} is served in several namespaces: name one of {names}"
        )

    def ambiguous(self, model: Model) -> bool:
        return sum(1 for m in self.models.values() if m.served == model.served) > 1

    def endpoints(self, key: Key) -> list[str]:
        """Ready endpoints of the ModelDeployment's Service (it has the ModelDeployment's name)."""
        namespace, name = key
        found: set[str] = set()
        for (ns, _), (service, ready) in self.slices.items():
            if ns == namespace and service == name:
                found.update(ready)
        return sorted(found)

    def changed(self, key: Key) -> asyncio.Event:
        """Set at the next change of this model or its endpoints (then replaced)."""
        return self._changed.setdefault(key, asyncio.Event())

    def _wake(self, key: Key) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()
