"""spec.adapters in the pod: a ConfigMap holding the adapter list (kvpilot_common.adapter_list)
that the server mounts and follows, so that a changed list reaches running pods without a new
pod template; the claims of pvc:// adapters mounted read-only; where each adapter's files are."""

from kvpilot_common import adapter_list
from kvpilot_operator.engine_flags import ADAPTER_CLAIMS_DIR as CLAIMS_DIR
from kvpilot_operator.engine_flags import ADAPTER_LIST_DIR as LIST_DIR
from kvpilot_operator.engine_flags import CACHE_DIR, PVC_DIR
from kvpilot_operator.source import pvc
from kvpilot_operator.spec import Spec

Object = dict


def config_map_name(name: str) -> str:
    return f"{name}-adapters"


def model_claim(spec: Spec) -> str | None:
    source = spec.model.source
    return pvc(source).claim if source.startswith("pvc://") else None


def claims(spec: Spec) -> list[str]:
    """The claims adapters live on that the pod does not mount for the model already."""
    found = {pvc(a.source).claim for a in spec.adapters if a.source.startswith("pvc://")}
    return sorted(found - {model_claim(spec)})


def path(spec: Spec, source: str) -> str:
    if source.startswith("hf://"):
        return f"{CACHE_DIR}/adapters/{source.removeprefix('hf://')}"
    where = pvc(source)
    if where.claim == model_claim(spec):
        return f"{PVC_DIR}/{where.path}"
    return f"{CLAIMS_DIR}/{where.claim}/{where.path}"


def config_map(meta: dict, spec: Spec) -> Object:
    entries = [
        adapter_list.Entry(a.name, a.source, path(spec, a.source), a.revision)
        for a in spec.adapters
    ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": config_map_name(meta["name"])},
        "data": {adapter_list.FILE_NAME: adapter_list.encode(entries)},
    }


def volumes(spec: Spec, name: str) -> list[Object]:
    if not spec.adapters:
        return []
    found: list[Object] = [{"name": "adapter-list", "configMap": {"name": config_map_name(name)}}]
    for i, claim in enumerate(claims(spec)):  # by index: a claim's name may be too long
        source = {"claimName": claim, "readOnly": True}
        found.append({"name": f"adapters-{i}", "persistentVolumeClaim": source})
    return found


def mounts(spec: Spec) -> list[Object]:
    if not spec.adapters:
        return []
    found: list[Object] = [{"name": "adapter-list", "mountPath": LIST_DIR, "readOnly": True}]
    for i, claim in enumerate(claims(spec)):
        where = f"{CLAIMS_DIR}/{claim}"
        found.append({"name": f"adapters-{i}", "mountPath": where, "readOnly": True})
    return found
