"""Rendering the chart offline with Helm's own Go SDK (helm-python-sdk), as `helm template`
would, optionally as if the cluster served given API versions."""

import json
import shutil
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native  # private: the only way to pass api_versions and kube_version

from kvpilot_testing.paths import CHART

RELEASE, NAMESPACE = "kvpilot", "kvpilot-system"
MONITORING_API = "monitoring.coreos.com/v1"


def render(
    values: dict | None = None,
    *,
    chart: Path = CHART,
    api_versions: tuple[str, ...] = (),
    kube_version: str | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Template name -> rendered text. Raises helm_python.HelmValuesError for values the
    schema rejects, HelmRenderError for a template that fails."""
    options: dict[str, Any] = {"name": RELEASE, "namespace": namespace, "is_install": True}
    if api_versions:
        options["api_versions"] = list(api_versions)
    if kube_version:
        options["kube_version"] = kube_version
    with helm_python.Chart.load(chart) as loaded:
        text = _native.call_string(
            "helm_render", loaded._raw(), json.dumps(values or {}), json.dumps(options)
        )
    return json.loads(text)


def objects(rendered: dict[str, str]) -> list[dict]:
    found = []
    for name, text in rendered.items():
        if name.endswith(".yaml"):
            found += [obj for obj in yaml.safe_load_all(text) if obj]
    return found


def notes(rendered: dict[str, str]) -> str:
    return next(text for name, text in rendered.items() if name.endswith("NOTES.txt"))


def of_kind(found: list[dict], kind: str) -> list[dict]:
    return [o for o in found if o["kind"] == kind]


def one(found: list[dict], kind: str) -> dict:
    (obj,) = of_kind(found, kind)
    return obj


def component(found: list[dict], name: str) -> list[dict]:
    """The objects of one part of the release ("operator", "gateway"), by their
    app.kubernetes.io/component label."""
    key = "app.kubernetes.io/component"
    return [o for o in found if (o["metadata"].get("labels") or {}).get(key) == name]


def chart_copy(tmp_path: Path, files: dict[str, str] | None) -> Path:
    """The chart without its files/ (dashboards and alert rules), then with `files` written."""
    target = tmp_path / "kvpilot"
    shutil.copytree(CHART, target, ignore=shutil.ignore_patterns("files", "__pycache__"))
    for name, text in (files or {}).items():
        path = target / "files" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return target
