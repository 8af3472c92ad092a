"""render(ModelDeployment) -> the Kubernetes objects that serve it. Pure: same input, same output.

Children have fixed names (the ModelDeployment's own), so create-or-patch is idempotent and an
operator restart finds what it made. Owner references are added by the handler (kopf.adopt).
"""

import math
from collections.abc import Sequence
from typing import Any

from kvpilot_common.naming import PORT, PORT_NAME, labels, selector_labels
from kvpilot_operator.engine_flags import (
    CACHE_DIR,
    KEYS_DIR,
    PVC_DIR,
    engine_args,
    model_path,
)
from kvpilot_operator.fit import model_cache_gib
from kvpilot_operator.source import pvc

PRESTOP_SLEEP_SECONDS = 5  # endpoints controllers and load balancers notice the pod is gone
# /tmp is HOME and Python's temporary directory, never weights: a modest limit bounds a runaway.
TMP_SIZE_LIMIT = "1Gi"
Object = dict[str, Any]


def desired_replicas(spec: dict) -> int:
    scaling = spec["autoscaling"]
    if not scaling["enabled"]:
        return spec["replicas"]
    return min(max(spec["replicas"], scaling["minReplicas"]), scaling["maxReplicas"])


def render(body: dict, image: str, pull_secrets: Sequence[str] = ()) -> list[Object]:
    """Deployment and Service, plus a PodDisruptionBudget when more than one replica runs.
    `image` is the operator's own version, used unless spec.image names another; model pods pull
    with `pull_secrets` (Secret names each model namespace must hold), as the operator does."""
    name, namespace, spec = body["metadata"]["name"], body["metadata"]["namespace"], body["spec"]
    image = spec.get("image") or image
    meta = {"name": name, "namespace": namespace, "labels": labels(name)}
    replicas = desired_replicas(spec)
    objects = [deployment(meta, spec, image, replicas, pull_secrets), service(meta, spec)]
    if replicas > 1:
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": meta,
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
            }
        )
    return objects


def service(meta: dict, spec: dict) -> Object:
    port = {"name": "http", "port": spec["service"]["port"], "targetPort": "http"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": spec["service"]["type"],
            "selector": selector_labels(meta["name"]),
            "ports": [{**port, "protocol": "TCP", "appProtocol": "http"}],
        },
    }


def deployment(
    meta: dict, spec: dict, image: str, replicas: int, pull_secrets: Sequence[str] = ()
) -> Object:
    name, probes = meta["name"], spec["probes"]
    # SIGTERM comes after preStop; the server then drains for up to drainTimeoutSeconds.
    grace = PRESTOP_SLEEP_SECONDS + probes["drainTimeoutSeconds"] + 10
    pod_spec: dict[str, Any] = {
        "containers": [server_container(spec, image, name)],
        "volumes": volumes(spec),
        "terminationGracePeriodSeconds": grace,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in pull_secrets]
    if spec["model"]["source"].startswith("hf://"):
        pod_spec["initContainers"] = [download_container(spec, image)]
    scheduling = spec.get("scheduling", {})
    for field in ("nodeSelector", "tolerations", "affinity", "runtimeClassName"):
        if scheduling.get(field):
            pod_spec[field] = scheduling[field]
    if scheduling.get("priorityClassName"):
        pod_spec["priorityClassName"] = scheduling["priorityClassName"]
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
                "spec": pod_spec,
            },
        },
    }


def _hardened() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def server_container(spec: dict, image: str, name: str) -> Object:
    resources = spec["resources"]
    limits = {"cpu": resources["cpu"], "memory": resources["memory"]}
    if resources["gpus"]:
        limits[resources["gpuResourceName"]] = str(resources["gpus"])
    probe = {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 5}
    startup_period = 10
    return {
        "name": "server",
        "image": image,
        "args": ["serve", *engine_args(spec, name)],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "env": [
            {"name": "KVPILOT_CACHE", "value": CACHE_DIR},
            {"name": "HF_HOME", "value": f"{CACHE_DIR}/hf"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},  # weights are local by now
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": {"requests": dict(limits), "limits": limits},
        # Model loading can take many minutes: the startup probe, not liveness, waits for it.
        "startupProbe": {
            **probe,
            "periodSeconds": startup_period,
            "failureThreshold": math.ceil(spec["probes"]["startupTimeoutSeconds"] / startup_period),
        },
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        # The server writes why it could not start here; logs are the fallback.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _hardened(),
        "volumeMounts": mounts(spec),
    }


def download_container(spec: dict, image: str) -> Object:
    model = spec["model"]
    repo = model["source"].removeprefix("hf://")
    command = ["timeout", str(model["downloadTimeoutSeconds"]), "hf", "download", repo]
    # --flag=value, as for the server: a revision is the user's and must not be read as a flag.
    command += [f"--revision={model['revision']}", f"--local-dir={model_path(model['source'])}"]
    env = [{"name": "HF_HOME", "value": f"{CACHE_DIR}/hf"}, {"name": "HOME", "value": "/tmp"}]
    if model.get("tokenSecretRef"):
        ref = model["tokenSecretRef"]
        secret = {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}}
        env.append({"name": "HF_TOKEN", "valueFrom": secret})
    return {
        "name": "download",
        "image": image,
        "command": command,
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _hardened(),
        "volumeMounts": [m for m in mounts(spec) if m["name"] in ("model-cache", "tmp")],
    }


def volumes(spec: dict) -> list[Object]:
    shm = {"medium": "Memory", "sizeLimit": f"{spec['resources']['shmMiB']}Mi"}
    found = [
        {"name": "shm", "emptyDir": shm},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
        {"name": "model-cache", "emptyDir": {"sizeLimit": f"{model_cache_gib(spec)}Gi"}},
    ]
    source = spec["model"]["source"]
    if source.startswith("pvc://"):
        claim = pvc(source).claim
        found.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if spec.get("auth", {}).get("apiKeySecretRef"):
        ref = spec["auth"]["apiKeySecretRef"]
        found.append(
            {"name": "api-keys", "secret": {"secretName": ref["name"], "defaultMode": 0o440}}
        )
    return found


def mounts(spec: dict) -> list[Object]:
    found = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "model-cache", "mountPath": CACHE_DIR},
    ]
    if spec["model"]["source"].startswith("pvc://"):
        found.append({"name": "models", "mountPath": PVC_DIR, "readOnly": True})
    if spec.get("auth", {}).get("apiKeySecretRef"):
        found.append({"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True})
    return found
