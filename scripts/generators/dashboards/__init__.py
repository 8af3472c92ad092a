"""kvpilot's Grafana dashboards, one module each, as the JSON Grafana imports.

Every metric name comes from kvpilot_common.metric_names; nothing here spells one. Labels the
queries rely on:
- engine metrics: `model` (the served model name: the ModelDeployment's name unless
  spec.model.servedModelName is set) plus the target labels `namespace` and `pod` that a
  Prometheus Operator PodMonitor adds;
- operator metrics: `namespace` and `name` of the ModelDeployment, which only survive scraping
  if the operator's scrape keeps them (honorLabels: true; otherwise Prometheus renames them to
  exported_namespace because the target has a `namespace` label of its own);
- gateway metrics: `namespace` and `model` (the ModelDeployment's name, never the client's
  spelling), kept by the gateway's scrape as the operator's are (honorLabels: true).
"""

import json

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from .fleet import fleet
from .gateway import gateway
from .model_serving import model_serving


def _prometheus_annotation_fields(board: dict) -> dict:
    """The SDK's AnnotationQuery (Grafana 11.6 schema) has no Prometheus-specific fields: without
    them Grafana draws scale events with an empty title and text."""
    for annotation in board["annotations"]["list"]:
        if annotation.get("expr"):
            annotation.update(
                {
                    "step": "15s",
                    "titleFormat": "Scaled {{direction}}",
                    "textFormat": "{{namespace}}/{{name}}: {{reason}}",
                    "tagKeys": "name,direction,reason",
                    "useValueForTime": False,
                }
            )
    return board


def _number_panels(board: dict) -> dict:
    """The SDK's builders leave panel ids unset; Grafana keys a panel's links and state by its
    id, so each gets its place on the board."""
    for i, p in enumerate(board["panels"], start=1):
        p["id"] = i
    return board


def dashboards() -> dict[str, dict]:
    """File name -> dashboard JSON."""
    built = {}
    boards = (
        ("model-serving.json", model_serving()),
        ("fleet.json", fleet()),
        ("gateway.json", gateway()),
    )
    for file, builder in boards:
        board = json.loads(JSONEncoder().encode(builder.build()))
        built[file] = _number_panels(_prometheus_annotation_fields(board))
    return built
