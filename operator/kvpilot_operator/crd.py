"""The ModelDeployment CRD as the operator reads it (crds/ is the source; the package carries a
link to it): names, the schema, and the schema's defaults applied as the API server would, so
render() always sees a complete spec even from a cluster whose CRD is older than the operator."""

import copy
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from typing import Any

import yaml


@cache
def crd() -> dict[str, Any]:
    text = (files("kvpilot_operator") / "modeldeployments.kvpilot.dev.yaml").read_text()
    return yaml.safe_load(text)


def schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def with_defaults(value: Any, node: dict[str, Any] | None = None) -> Any:
    """A copy of `value` with the structural schema's defaults filled in, recursively (a default
    that is itself an object gets its own fields' defaults, as in the API server). A null where
    the schema does not allow one is dropped first, then defaulted, as the API server does: YAML
    writes `engine:` with every child commented out as a null."""
    return _fill(copy.deepcopy(value), schema() if node is None else node)


def defaulted(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ModelDeployment (a kopf body or a plain dict) as a defaulted plain dict."""
    return with_defaults(dict(body))


def _fill(value: Any, node: dict[str, Any]) -> Any:
    """Fill defaults into `value` in place (it is already a private copy)."""
    if isinstance(value, dict) and "properties" in node:
        for name, child in node["properties"].items():
            if name in value and value[name] is None and not child.get("nullable"):
                del value[name]
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = _fill(value[name], child)
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        values = node["additionalProperties"]
        for name in list(value):
            if value[name] is None and not values.get("nullable"):
                del value[name]  # a map's null values go too (a list's null items stay)
            else:
                value[name] = _fill(value[name], values)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            value[i] = _fill(item, node["items"])
    return value
