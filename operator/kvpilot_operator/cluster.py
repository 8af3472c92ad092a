"""The operator's reads and writes of child objects, through lightkube, as plain API dicts."""

from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

KINDS: dict[str, Any] = {
    "Deployment": Deployment,
    "Service": Service,
    "PodDisruptionBudget": PodDisruptionBudget,
}
FIELD_MANAGER = "kvpilot-operator"


class Cluster:
    def __init__(self, client: Client | None = None) -> None:
        self.client = client or Client(field_manager=FIELD_MANAGER)

    def apply(self, obj: dict) -> str:
        """Bring one child to its rendered state: merge-patch it, or create it if it is missing.
        Lists (containers, env, volumes) are replaced whole, so removed entries go away."""
        kind, meta = KINDS[obj["kind"]], obj["metadata"]
        try:
            self.client.patch(
                kind, meta["name"], obj, namespace=meta["namespace"], patch_type=PatchType.MERGE
            )
            return "patched"
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        self.client.create(codecs.from_dict(obj))
        return "created"

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        try:
            self.client.delete(KINDS[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return False
        return True

    def get(self, kind: str, name: str, namespace: str) -> dict | None:
        try:
            return self.client.get(KINDS[kind], name, namespace=namespace).to_dict()
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return None

    def pods(self, namespace: str, labels: dict[str, str]) -> list[dict]:
        found = self.client.list(Pod, namespace=namespace, labels=labels)
        pods = [p.to_dict() for p in found]
        # Filter here too: a selector the server ignored must not pull in strangers' pods.
        return [p for p in pods if labels.items() <= (p["metadata"].get("labels") or {}).items()]
