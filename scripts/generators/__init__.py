"""kvpilot's generators: every file in the repository that is made from another source.

Each generator module returns its files as {path relative to the repository root: bytes};
outputs.py gathers them and scripts/generate.py writes or checks them:

- promql.py, dashboards/ (one module per dashboard), alerts.py, monitoring.py: the Grafana
  dashboards and Prometheus alert rules in charts/kvpilot/files/, from kvpilot_common.metric_names;
- crd_reference.py: docs/crd-reference.md, from the ModelDeployment CRD's schema;
- chart.py: the chart's CRD copy and RBAC rules, from crds/ and kvpilot_operator.permissions.

Modules import each other relatively: scripts/generate.py imports this package as `generators`
(its own folder is on sys.path when run as a script), the tests as `scripts.generators`. Not
shipped: the wheel packages only operator/, server/ and gateway/.
"""
