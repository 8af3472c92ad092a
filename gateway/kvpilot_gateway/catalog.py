"""What the gateway knows of the cluster: the ModelDeployments it watches and the endpoints of
their Services, as the watches report them (watch.py feeds it). Pure: no I/O; one writer, the
event loop.

A request names a model the way clients of one server do: its served model name, or
`namespace/served name`; names.py decides which ModelDeployment answers when several could.
Each of a ModelDeployment's LoRA adapters (spec.adapters) is a served name of its own, under the
same rules, whose requests go to the same pods (adapters.py says which of them).
Endpoints are the
ModelDeployment's pods that are Ready and not terminating, with their pod IP: the rule the
Service's endpoint controller applies. (The gateway watches the operator's pods rather than
EndpointSlices because the readiness is the same and an EndpointSlice can never hold a loopback
address, which is where the tests' kubelet runs its servers.)
"""

import asyncio
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvpilot_common.errors import ModelNotFoundError
from kvpilot_common.naming import INSTANCE_LABEL, PORT, PORT_NAME
from kvpilot_gateway import names

Key = tuple[str, str]  # (namespace, ModelDeployment name)


@dataclass
class Model:
    namespace: str
    name: str
    served: str  # the name clients send as `model`, and the server behind it answers to
    replicas: int  # spec.replicas: 0 means scaled to zero
    autoscaling: bool  # can anything wake it from zero?
    ready_replicas: int = 0  # status.readyReplicas, for /v1/models
    created: str = ""  # metadata.creationTimestamp: the older of two namesakes keeps the name
    annotations: dict[str, str] = field(default_factory=dict)
    adapters: tuple[str, ...] = ()  # spec.adapters' names: each served beside the model
    adapter: str | None = None  # set on the entry that serves one of them as `served`
    parent: str | None = None  # and there, the model's own served name

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
        created=str(meta.get("creationTimestamp") or ""),
        annotations=dict(meta.get("annotations") or {}),
        adapters=tuple(
            str(a["name"])
            for a in spec.get("adapters") or ()
            if isinstance(a, dict) and "name" in a
        ),
    )


def served_entries(model: Model) -> list[Model]:
    """The model, then one entry per adapter: the same ModelDeployment under the adapter's name."""
    return [model] + [
        dataclasses.replace(model, served=a, adapter=a, parent=model.served) for a in model.adapters
    ]


def endpoint_of(pod: dict) -> tuple[str, str | None]:
    """(ModelDeployment name, "ip:port" when the pod takes requests, else None)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    name = (meta.get("labels") or {}).get(INSTANCE_LABEL, "")
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if not ready or meta.get("deletionTimestamp") or not status.get("podIP"):
        return name, None
    ports = [
        p["containerPort"]
        for c in (pod.get("spec") or {}).get("containers") or []
        for p in c.get("ports") or []
        if p.get("name") == PORT_NAME
    ]
    return name, f"{status['podIP']}:{ports[0] if ports else PORT}"


class Catalog:
    def __init__(self, policy: names.Policy | None = None) -> None:
        self.policy = policy or names.Policy()
        self.models: dict[Key, Model] = {}
        # (namespace, pod name) -> (ModelDeployment name, endpoint if it takes requests)
        self.pods: dict[Key, tuple[str, str | None]] = {}
        # Every request asks for its model's endpoints: kept per model, dropped when it changes.
        self._endpoints: dict[Key, list[str]] = {}
        self._changed: dict[Key, asyncio.Event] = {}
        self._by_served: dict[str, list[Model]] | None = None

    # -- the watches' side ----------------------------------------------------------------------

    def set_model(self, md: dict) -> None:
        model = model_from(md)
        self.models[model.key] = model
        self._by_served = None
        self._wake(model.key)

    def drop_model(self, namespace: str, name: str) -> None:
        self.models.pop((namespace, name), None)
        self._by_served = None
        self._wake((namespace, name))

    def set_pod(self, pod: dict) -> None:
        meta = pod["metadata"]
        self.set_member((meta["namespace"], meta["name"]), *endpoint_of(pod))

    def set_member(self, key: Key, model: str, endpoint: str | None) -> None:
        """One server of a model (a pod, or a backend without Kubernetes): its endpoint while
        it takes requests, else None."""
        before = self.pods.get(key)
        if before != (model, endpoint):
            self.pods[key] = (model, endpoint)
            self._wake((key[0], model))
            if before is not None and before[0] != model:  # relabelled: its old model lost it
                self._wake((key[0], before[0]))

    def drop_pod(self, namespace: str, name: str) -> None:
        model, _ = self.pods.pop((namespace, name), ("", None))
        self._wake((namespace, model))

    def replace(
        self,
        namespace: str | None,
        mds: Iterable[dict] | None = None,
        pods: Iterable[dict] | None = None,
    ) -> None:
        """A fresh list of one namespace (None: all) after a watch broke: what that list
        covers and does not hold is gone."""

        def covered(key: Key) -> bool:
            return namespace is None or key[0] == namespace

        if mds is not None:
            gone = {k for k in self.models if covered(k)}
            self.models = {k: m for k, m in self.models.items() if not covered(k)}
            self._by_served = None
            for md in mds:
                self.set_model(md)
            for key in gone - set(self.models):
                self._wake(key)
        if pods is not None:
            self._endpoints.clear()
            models = {(k[0], m) for k, (m, _) in self.pods.items() if covered(k)}
            self.pods = {k: v for k, v in self.pods.items() if not covered(k)}
            for pod in pods:
                self.set_pod(pod)
            for key in models:
                self._wake(key)

    # -- the requests' side ---------------------------------------------------------------------

    def resolve(self, requested: str) -> Model:
        """The model a request names: `served name`, or `namespace/served name` (names.py)."""
        found = names.owner(
            names.candidates(requested, self._namesakes(requested), self.policy),
            self.policy.prefer,
        )
        if found is None:
            raise ModelNotFoundError(f"The model {requested!r} does not exist")
        return found  # type: ignore[return-value]

    def _namesakes(self, requested: str) -> list[Model]:
        """The models serving either reading of the name (a served-name index, rebuilt after a
        model changes: /v1/models resolves every name)."""
        if self._by_served is None:
            self._by_served = {}
            for model in self.models.values():
                for entry in served_entries(model):
                    self._by_served.setdefault(entry.served, []).append(entry)
        exact, qualified = names.readings(requested)
        found = list(self._by_served.get(exact, ()))
        if qualified is not None:
            found += self._by_served.get(qualified[1], ())
        return found

    def listed(self) -> list[tuple[str, Model]]:
        """(the name that finds it, model) for every model a name finds: its served name where
        it owns that, else namespace-qualified; one that neither finds (a reservation keeps
        both from it) is not listed."""
        out = []
        for model in sorted(self.models.values(), key=lambda m: m.key):
            for entry in served_entries(model):
                for name in (entry.served, entry.qualified):
                    try:
                        found = self.resolve(name)
                    except ModelNotFoundError:
                        continue
                    if (found.key, found.adapter) == (entry.key, entry.adapter):
                        out.append((name, entry))
                        break
        return out

    def endpoints(self, key: Key) -> list[str]:
        """The ModelDeployment's pods that take requests, as "ip:port"."""
        if key not in self._endpoints:
            namespace, name = key
            self._endpoints[key] = sorted(
                endpoint
                for (ns, _), (model, endpoint) in self.pods.items()
                if ns == namespace and model == name and endpoint
            )
        return self._endpoints[key]

    def changed(self, key: Key) -> asyncio.Event:
        """Set at the next change of this model or its endpoints (then replaced)."""
        return self._changed.setdefault(key, asyncio.Event())

    def _wake(self, key: Key) -> None:
        self._endpoints.pop(key, None)
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()
