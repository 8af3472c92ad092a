"""render(ModelDeployment) -> the plan that serves it: the Kubernetes objects to apply, in order,
and the children to delete. Pure: same input, same output; handlers.reconcile() only carries it
out, so every rule about which children exist (a PodDisruptionBudget only above one replica)
lives here, where it is tested without a cluster.

Children have fixed names (the ModelDeployment's own), so create-or-patch is idempotent and an
operator restart finds what it made. Owner references are added by the handler (kopf.adopt).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot_common.naming import PORT, labels, selector_labels
from kvpilot_operator import adapters
from kvpilot_operator.pod import Object, SecretKey, pod_spec
from kvpilot_operator.spec import Spec


@dataclass(frozen=True)
class Removal:
    """A child the spec no longer has; deleting one already gone is no error."""

    kind: str
    name: str
    namespace: str


@dataclass(frozen=True)
class Plan:
    # Deployment first: the API server refusing it leaves no new Service or PDB behind.
    apply: tuple[Object, ...]
    delete: tuple[Removal, ...] = ()


def render(
    name: str,
    namespace: str,
    spec: Spec,
    image: str,
    pull_secrets: Sequence[str] = (),
    gateway_secret: SecretKey | None = None,
) -> Plan:
    """Deployment and Service, plus a PodDisruptionBudget when more than one replica runs (a
    voluntary disruption such as a node drain then takes them one at a time; a budget of one
    unavailable out of one protects nothing, so below two the plan deletes any left from a
    larger size). `image` is the operator's own version, used unless spec.image names another;
    model pods pull with `pull_secrets` (Secret names each model namespace must hold), as the
    operator does, and read the gateway's secret from `gateway_secret` (likewise; pod.py)."""
    meta = {"name": name, "namespace": namespace, "labels": labels(name)}
    replicas = spec.desired_replicas
    objects = [
        deployment(meta, spec, spec.image or image, replicas, pull_secrets, gateway_secret),
        service(meta, spec),
    ]
    removals = []
    if spec.adapters:  # after the Deployment: its pods wait for the ConfigMap they mount
        objects.append(adapters.config_map(meta, spec))
    else:
        removals.append(Removal("ConfigMap", adapters.config_map_name(name), namespace))
    if replicas > 1:
        objects.append(pod_disruption_budget(meta))
    else:
        removals.append(Removal("PodDisruptionBudget", name, namespace))
    return Plan(tuple(objects), tuple(removals))


def pod_disruption_budget(meta: dict) -> Object:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(meta["name"])}},
    }


def service(meta: dict, spec: Spec) -> Object:
    port = {"name": "http", "port": spec.service.port, "targetPort": "http"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": spec.service.type,
            "selector": selector_labels(meta["name"]),
            "ports": [{**port, "protocol": "TCP", "appProtocol": "http"}],
        },
    }


def deployment(
    meta: dict,
    spec: Spec,
    image: str,
    replicas: int,
    pull_secrets: Sequence[str] = (),
    gateway_secret: SecretKey | None = None,
) -> Object:
    name = meta["name"]
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name)},
            # A new pod must be ready (model loaded) before an old one goes.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": labels(name), "annotations": annotations},
                "spec": pod_spec(spec, image, name, pull_secrets, gateway_secret),
            },
        },
    }
