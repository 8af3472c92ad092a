"""The operator's reads and writes through lightkube, as plain API dicts, and the names the
kopf handlers and the autoscaler share."""

from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from kvpilot_common.kube import ModelDeploymentResource
from kvpilot_common.naming import GROUP, PLURAL, VERSION

KINDS: dict[str, Any] = {
    "Deployment": Deployment,
    "Service": Service,
    "PodDisruptionBudget": PodDisruptionBudget,
    "ConfigMap": ConfigMap,
}
FIELD_MANAGER = "kvpilot-operator"
RESOURCE = (GROUP, VERSION, PLURAL)  # what the kopf handlers watch
RETRY_SECONDS = 5  # after an API error; kopf's default of 60 s leaves status stale too long
_cluster: "Cluster | None" = None


def namespaced(namespace: str | None) -> str:
    """A ModelDeployment handler's namespace: kopf types it optional (cluster-scoped resources
    have none), and a ModelDeployment is namespaced, so kopf always passes one."""
    assert namespace is not None, "a ModelDeployment is namespaced"
    return namespace


def cluster() -> "Cluster":
    """The one client of the process (lightkube's connection pool is shared)."""
    global _cluster
    _cluster = _cluster or Cluster()
    return _cluster


class Cluster:
    def __init__(self, client: Client | None = None) -> None:
        self.client = client or Client(field_manager=FIELD_MANAGER)

    def apply(self, obj: dict) -> None:
        """Server-side apply, as the operator's one field manager, forced: the child becomes
        what render() made. A field render() stops emitting (an init container, a toleration,
        a nodeSelector entry) is removed, since this manager owned it; a field another manager
        owns (an annotation from `kubectl annotate`) stays; an object already so is not
        written at all. Creating a missing object this way needs `create` as well as `patch`.

        The dict goes as it is, not through lightkube's models: those drop a field they do not
        know (a misspelt toleration key the CRD passes through would vanish, and the pod would
        tolerate something else) and refuse a value of the wrong type before sending it, with
        no word from the API server. Sent as it is, the API server refuses both, in its words
        (rejection.py)."""
        meta = obj["metadata"]
        self.client.patch(
            KINDS[obj["kind"]],
            meta["name"],
            obj,
            namespace=meta.get("namespace"),
            patch_type=PatchType.APPLY,
            field_manager=FIELD_MANAGER,
            force=True,
        )

    def delete(self, kind: str, name: str, namespace: str) -> bool:
        try:
            self.client.delete(KINDS[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return False
        return True

    def patch_status(
        self, name: str, namespace: str, status: dict, resource_version: str | None = None
    ) -> dict:
        """Merge-patch a ModelDeployment's status (only if still at `resource_version`, when
        given: 409 Conflict otherwise); the status as stored afterwards."""
        patch: dict[str, Any] = {"status": status}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        updated = self.client.patch(
            ModelDeploymentResource.Status,
            name,
            patch,
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        return dict(updated.to_dict().get("status") or {})
