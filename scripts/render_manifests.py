#!/usr/bin/env python3
"""Write the manifests scripts/security-scan.sh hands to checkov: for each of the chart's main
configurations, OUTDIR/<configuration>/ holds

    chart.yaml               the chart rendered with those values (multi-document YAML)
    model-builtin-cpu.yaml   what the operator creates for crds/samples/builtin-cpu.yaml (its
                             render(), with the CRD's defaults applied as the API server would),
                             in the release namespace, where watch.scope=Release puts it

Configurations: defaults; watch-all (watch.scope=All: a ClusterRole instead of a Role); all-on
(ServiceMonitor, PodMonitor and PrometheusRule with monitoring.skipApiCheck, dashboards,
NetworkPolicy). Each is scanned on its own, so that an object of one (a NetworkPolicy) never
vouches for another.

The chart is rendered with Helm's own Go SDK, exactly as the chart tests do
(testing/kvpilot_testing/helm.py).

Run:   .venv/bin/python scripts/render_manifests.py OUTDIR
"""

import argparse
from pathlib import Path

import yaml

from kvpilot_operator import crd
from kvpilot_operator.render import render as render_model
from kvpilot_operator.spec import Spec
from kvpilot_testing.helm import NAMESPACE, objects, render

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = ROOT / "crds" / "samples" / "builtin-cpu.yaml"
# The operator's own default model image, as the chart passes it (KVPILOT_IMAGE).
MODEL_IMAGE = "ghcr.io/kvpilot/kvpilot:0.1.0"

CONFIGURATIONS: dict[str, dict] = {
    "defaults": {},
    "watch-all": {"watch": {"scope": "All"}},
    "all-on": {
        "monitoring": {
            "skipApiCheck": True,
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        "grafana": {"dashboards": {"enabled": True}},
        "networkPolicy": {"enabled": True},
    },
}


def model_objects() -> list[dict]:
    body = crd.with_defaults(yaml.safe_load(SAMPLE.read_text()))
    name = body["metadata"]["name"]
    return list(render_model(name, NAMESPACE, Spec.from_defaulted(body), MODEL_IMAGE).apply)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    outdir = parser.parse_args().outdir
    model = model_objects()
    for configuration, values in CONFIGURATIONS.items():
        target = outdir / configuration
        target.mkdir(parents=True, exist_ok=True)
        for name, found in (("chart", objects(render(values))), ("model-builtin-cpu", model)):
            path = target / f"{name}.yaml"
            path.write_text(yaml.safe_dump_all(found, sort_keys=False))
            print(f"{path}: {len(found)} objects")


if __name__ == "__main__":
    main()
