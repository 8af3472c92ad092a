"""Every Kubernetes API permission the operator and the gateway need, as data: the one
declaration. The Helm chart's RBAC is generated from it (scripts/generate.py) and
tests/chart checks the rendered RBAC against it.

Derived from the calls the code makes: cluster.py (lightkube: children by server-side apply,
which the API server checks as `patch`, and as `create` too when the object is missing),
autoscaler.py (lightkube: the scale and status subresources), handlers.py (kopf.event,
kopf.adopt, the status patch) and kopf itself (watching ModelDeployments, its annotations,
observing CRDs and namespaces). Not listed: discovery (/api, /apis) and /version, which kopf
reads and every authenticated client may read (the system:discovery and
system:public-info-viewer ClusterRoles).
"""

from dataclasses import dataclass

KVPILOT = "kvpilot.dev"


@dataclass(frozen=True)
class Permission:
    api_group: str  # "" is the core group
    resource: str  # plural, or plural/subresource
    verbs: tuple[str, ...]
    why: str


# In every watched namespace: a Role there, or the ClusterRole when watching all namespaces.
NAMESPACED = (
    Permission(
        KVPILOT,
        "modeldeployments",
        ("list", "watch", "patch"),
        "kopf lists and watches them, keeps its progress in their annotations and adds its "
        "finalizer (the status timer and the autoscaler daemon need one)",
    ),
    Permission(
        KVPILOT,
        "modeldeployments/status",
        ("patch",),
        "status from the children (handlers.report) and status.autoscaling",
    ),
    Permission(
        KVPILOT,
        "modeldeployments/scale",
        ("patch",),
        "the autoscaler sets spec.replicas through the scale subresource",
    ),
    Permission(
        KVPILOT,
        "modeldeployments/finalizers",
        ("update",),
        "kopf.adopt sets blockOwnerDeletion on children; where the "
        "OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift), creating "
        "them needs this",
    ),
    Permission(
        "apps",
        "deployments",
        ("list", "watch", "create", "patch"),
        "Cluster.apply server-side-applies the model Deployment (patch; create too when it is "
        "missing); the status daemon and the autoscaler see them through kopf's watch",
    ),
    Permission(
        "", "services", ("create", "patch"), "Cluster.apply: the model Service (as Deployments)"
    ),
    Permission(
        "",
        "configmaps",
        ("create", "patch", "delete"),
        "Cluster.apply: the adapter list of a model with spec.adapters (adapters.py); deleted "
        "when the list is emptied",
    ),
    Permission(
        "policy",
        "poddisruptionbudgets",
        ("create", "patch", "delete"),
        "Cluster.apply above one replica; deleted again at one replica",
    ),
    Permission(
        "", "pods", ("list", "watch"), "status and the autoscaler watch model pods (children.py)"
    ),
    Permission("", "events", ("create",), "kopf.event: condition changes and scale decisions"),
)

# Cluster-scoped objects, which no Role can grant. Read-only.
CLUSTER = (
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "kopf's resource observer notices the ModelDeployment CRD being installed or changed",
    ),
)

# Only when watching named namespaces (-n): kopf's namespace observer lists and watches them to
# notice watched namespaces coming and going. Watching all namespaces, it does not.
CLUSTER_WHEN_NAMESPACED = (
    Permission(
        "",
        "namespaces",
        ("list", "watch"),
        "kopf's namespace observer, in namespaced mode only",
    ),
)

# Only with more than one operator replica (kopf's peering, peering.py), in every watched
# namespace (a Role there). kopf watches the peering object and patches its own keep-alive into
# its status; each replica creates the object at start-up when it is missing (Helm cannot: it
# would be an object of a CRD the same release installs).
PEERING = (
    Permission(
        "kopf.dev",
        "kopfpeerings",
        ("list", "watch", "patch", "create"),
        "kopf's peering: which replica acts (peering.ensure_peering creates the object)",
    ),
)
# The same watching all namespaces: one cluster-scoped ClusterKopfPeering (the ClusterRole).
PEERING_CLUSTER = (
    Permission(
        "kopf.dev",
        "clusterkopfpeerings",
        ("list", "watch", "patch", "create"),
        "kopf's peering watching all namespaces (peering.ensure_peering creates the object)",
    ),
)

# `kvpilot gateway` (gateway/kvpilot_gateway), under its own ServiceAccount: in every namespace it
# watches (a Role there, or a ClusterRole when watching all namespaces), like NAMESPACED. It reads
# what to route to and writes only its own annotation: no status, no children, nothing
# cluster-scoped. No `create`: an apply to a ModelDeployment deleted meanwhile would be one (the
# API server refuses it anyway, 422: an object of one annotation has no spec).
GATEWAY = (
    Permission(
        KVPILOT,
        "modeldeployments",
        ("list", "watch", "patch"),
        "the models it serves and their served names come from a watch (watch.py); it "
        "server-side-applies its held.gateway.kvpilot.dev/<gateway id> annotation "
        "(announce.py, kvpilot_common.demand), which wakes a model scaled to zero",
    ),
    Permission(
        "",
        "pods",
        ("list", "watch"),
        "the model servers' pods, Ready or not, and their IPs: where it sends requests, "
        "watched rather than polled (watch.py; only the operator's pods, by label)",
    ),
)
