"""A model pod's spec: the server container (and the init container that downloads hf://
weights), hardened, with probes sized for loading and a grace period for draining; its volumes
(each with a size limit) and where they mount; spec.scheduling passed through."""

import copy
import math
from collections.abc import Sequence
from typing import Any

from kvpilot_common import trust
from kvpilot_common.naming import PORT, PORT_NAME
from kvpilot_operator import adapters
from kvpilot_operator.engine_flags import (
    CACHE_DIR,
    KEYS_DIR,
    PVC_DIR,
    engine_args,
    model_path,
)
from kvpilot_operator.model_cache import model_cache_gib
from kvpilot_operator.source import pvc
from kvpilot_operator.spec import Spec

PRESTOP_SLEEP_SECONDS = 5  # endpoints controllers and load balancers notice the pod is gone
# /tmp is HOME and Python's temporary directory, never weights: a modest limit bounds a runaway.
TMP_SIZE_LIMIT = "1Gi"
Object = dict[str, Any]


SecretKey = tuple[str, str]  # a Secret's name and its data key


def pod_spec(
    spec: Spec,
    image: str,
    name: str,
    pull_secrets: Sequence[str] = (),
    gateway_secret: SecretKey | None = None,
) -> Object:
    """The pod template's spec for ModelDeployment `name`."""
    # SIGTERM comes after preStop; the server then drains for up to drainTimeoutSeconds.
    grace = PRESTOP_SLEEP_SECONDS + spec.probes.drain_timeout_seconds + 10
    pod: dict[str, Any] = {
        "containers": [server_container(spec, image, name, gateway_secret)],
        "volumes": volumes(spec) + adapters.volumes(spec, name),
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
        pod["imagePullSecrets"] = [{"name": secret} for secret in pull_secrets]
    if spec.model.source.startswith("hf://"):
        pod["initContainers"] = [download_container(spec, image)]
    pod.update(scheduling(spec))
    return pod


def scheduling(spec: Spec) -> Object:
    """spec.scheduling's fields that are set, as the pod's own: copies, so that nothing done to
    a rendered object reaches the spec it came from."""
    wanted = spec.scheduling
    fields = {
        "nodeSelector": wanted.node_selector,
        "tolerations": list(wanted.tolerations),
        "affinity": wanted.affinity,
        "runtimeClassName": wanted.runtime_class_name,
        "priorityClassName": wanted.priority_class_name,
    }
    return {field: copy.deepcopy(value) for field, value in fields.items() if value}


def _hardened() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def server_container(
    spec: Spec, image: str, name: str, gateway_secret: SecretKey | None = None
) -> Object:
    resources = spec.resources
    limits = {"cpu": resources.cpu, "memory": resources.memory}
    if resources.gpus:
        limits[resources.gpu_resource_name] = str(resources.gpus)
    probe = {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 5}
    # The startup probe's period is how long a loaded server may sit unready: every wake from
    # zero and every scale-up waits for it, so probe often (a GET of /ready is cheap) and let
    # the threshold, not the period, hold the start-up timeout.
    startup_period = 2
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
            *_gateway_secret(gateway_secret),
        ],
        "resources": {"requests": dict(limits), "limits": limits},
        # Model loading can take many minutes: the startup probe, not liveness, waits for it.
        "startupProbe": {
            **probe,
            "periodSeconds": startup_period,
            "failureThreshold": math.ceil(spec.probes.startup_timeout_seconds / startup_period),
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
        "volumeMounts": mounts(spec) + adapters.mounts(spec),
    }


def _gateway_secret(ref: SecretKey | None) -> list[Object]:
    """The secret kvpilot's gateway proves itself with (kvpilot_common.trust): with it a
    server continues the gateway's broken streams and serves the tenant it names. Optional: a
    model namespace without the Secret still serves, only without those."""
    if ref is None:
        return []
    name, key = ref
    secret = {"secretKeyRef": {"name": name, "key": key, "optional": True}}
    return [{"name": trust.ENV, "valueFrom": secret}]


def download_container(spec: Spec, image: str) -> Object:
    model = spec.model
    repo = model.source.removeprefix("hf://")
    command = ["timeout", str(model.download_timeout_seconds), "hf", "download", repo]
    # --flag=value, as for the server: a revision is the user's and must not be read as a flag.
    command += [f"--revision={model.revision}", f"--local-dir={model_path(model.source)}"]
    env: list[Object] = [
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/hf"},
        {"name": "HOME", "value": "/tmp"},
    ]
    if model.token_secret_ref:
        ref = model.token_secret_ref
        secret = {"secretKeyRef": {"name": ref.name, "key": ref.key}}
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


def volumes(spec: Spec) -> list[Object]:
    shm = {"medium": "Memory", "sizeLimit": f"{spec.resources.shm_mib}Mi"}
    found: list[Object] = [
        {"name": "shm", "emptyDir": shm},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
        {"name": "model-cache", "emptyDir": {"sizeLimit": f"{model_cache_gib(spec)}Gi"}},
    ]
    source = spec.model.source
    if source.startswith("pvc://"):
        claim = pvc(source).claim
        found.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if spec.api_key_secret_ref:
        ref = spec.api_key_secret_ref
        found.append({"name": "api-keys", "secret": {"secretName": ref.name, "defaultMode": 0o440}})
    return found


def mounts(spec: Spec) -> list[Object]:
    found: list[Object] = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "model-cache", "mountPath": CACHE_DIR},
    ]
    if spec.model.source.startswith("pvc://"):
        found.append({"name": "models", "mountPath": PVC_DIR, "readOnly": True})
    if spec.api_key_secret_ref:
        found.append({"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True})
    return found
