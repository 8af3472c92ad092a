"""Grafana building blocks the dashboards share: panels, variables, the dashboard shell.

Built with grafana-foundation-sdk (Grafana Labs' own builders, generated from Grafana's schemas),
so a field Grafana renamed fails here rather than in a user's Grafana.
"""

from typing import Any

from grafana_foundation_sdk.builders import common as viz
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

from kvpilot_common import metric_names as names

from ..promql import ENGINE, QUANTILES, quantile

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def target(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range()


def panel(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str = "short",
    width: int = 12,
    bars: bool = False,
    ratio: bool = False,
) -> timeseries.Panel:
    built = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .height(8)
        .span(width)
        .legend(
            viz.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(viz.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    if ratio:
        built = built.max(1)
    if bars:
        built = built.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    for i, (expr, legend) in enumerate(queries):
        built = built.with_target(target(expr, legend, chr(ord("A") + i)))
    return built


def variables(
    source: str,
    model_label: str,
    model_description: str = "The `model` label of engine metrics (the ModelDeployment's name, "
    "or its spec.model.servedModelName) and the `name` label of operator metrics",
    pods: bool = True,
) -> list[Any]:
    """datasource, namespace, ModelDeployment (`model_label` of `source`) and, with `pods`, pod."""

    def query(name: str, label: str, values: str, description: str) -> Any:
        return (
            dashboard.QueryVariable(name)
            .label(label)
            .description(description)
            .datasource(DATASOURCE)
            .query(values)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )

    found = [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query(
            "namespace",
            "Namespace",
            f"label_values({source}, namespace)",
            "Namespace of the ModelDeployments",
        ),
        query(
            "model",
            "ModelDeployment",
            f'label_values({source}{{namespace=~"$namespace"}}, {model_label})',
            model_description,
        ),
    ]
    if pods:
        engine_pods = f'{names.ENGINE_INFO}{{namespace=~"$namespace", model=~"$model"}}'
        found.append(query("pod", "Pod", f"label_values({engine_pods}, pod)", "Model server pods"))
    return found


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["kvpilot"])
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .annotation(
            dashboard.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
        )
    )


def latency_panel(
    title: str, histogram: str, description: str, selector: str = ENGINE
) -> timeseries.Panel:
    queries = [
        (quantile(q, histogram, selector, "model"), f"{{{{model}}}} p{round(q * 100)}")
        for q in QUANTILES
    ]
    return panel(title, description, queries, unit="s", width=8)
