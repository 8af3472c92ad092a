"""The Helm chart: lint, every rendered object against the official Kubernetes schemas (strict),
the values schema, the CRD copy, the operator's pod and command line, and the optional objects
(monitoring, dashboards, NetworkPolicy, extraObjects)."""

import argparse
import copy
import json
from importlib.metadata import version
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from kvpilot_common import naming
from kvpilot_common.naming import PORT
from kvpilot_operator import crd
from kvpilot_operator.main import add_operator_args
from kvpilot_operator.render import render as render_model
from kvpilot_operator.spec import Spec
from kvpilot_testing.helm import (
    MONITORING_API,
    NAMESPACE,
    chart_copy,
    component,
    notes,
    objects,
    of_kind,
    one,
    render,
)
from kvpilot_testing.paths import CHART, ROOT
from scripts.generators import monitoring

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest known.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
API = (MONITORING_API,)  # as if the cluster served the monitoring API
EVERYTHING_ON = {
    "imagePullSecrets": [{"name": "regcred"}],
    "global": {"imageRegistry": "registry.example.com"},
    "monitoring": {
        "labels": {"release": "prometheus"},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
    },
    "grafana": {"dashboards": {"enabled": True, "folder": "kvpilot"}},
    "networkPolicy": {"enabled": True},
    "extraObjects": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {}},
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: '{{ .Release.Name }}-extra'\n",
    ],
}
SCOPES = {
    "release": {"watch": {"scope": "Release"}},
    "namespaces": {"watch": {"scope": "Namespaces", "namespaces": ["team-a", "team-b"]}},
    "all": {"watch": {"scope": "All"}},
}
# A small rule file and dashboard, for the chart rendered with files/ present.
ALERTS = "groups:\n- name: test\n  rules:\n  - alert: Test\n    expr: vector(1)\n"
FILES = {"alerts.yaml": ALERTS, "dashboards/Model Serving.json": '{"title": "{{ x }}"}\n'}
SAMPLE = ROOT / "crds" / "samples" / "builtin-cpu.yaml"


def _merge(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def _scenarios(tmp_path: Path) -> list[tuple[str, list[dict]]]:
    with_files = chart_copy(tmp_path / "with", FILES)
    without = chart_copy(tmp_path / "without", None)
    found = [("defaults", objects(render()))]
    for scope, values in SCOPES.items():
        on = _merge(values, EVERYTHING_ON)
        peering = _merge(values, {"operator": {"replicas": 2}})  # kopf's peering CRDs and RBAC
        found += [
            (f"{scope}", objects(render(values))),
            (f"{scope}-peering", objects(render(peering))),
            (f"{scope}-all-on-no-api", objects(render(on, chart=with_files))),
            (f"{scope}-all-on", objects(render(on, chart=with_files, api_versions=API))),
            (f"{scope}-all-on-chart-files", objects(render(on, api_versions=API))),
            (f"{scope}-all-on-no-files", objects(render(on, chart=without, api_versions=API))),
        ]
    return found


def _operator(found: list[dict], kind: str) -> dict:
    """The operator's object of that kind (the gateway has its own Deployment, Service...)."""
    return one(component(found, "operator"), kind)


def _operator_pod(found: list[dict]) -> dict:
    return _operator(found, "Deployment")["spec"]["template"]["spec"]


def _container(found: list[dict]) -> dict:
    (container,) = _operator_pod(found)["containers"]
    return container


def _model_objects() -> list[dict]:
    body = crd.with_defaults(yaml.safe_load(SAMPLE.read_text()))
    name = body["metadata"]["name"]
    return list(render_model(name, "team-a", Spec.from_defaulted(body), "kvpilot:test").apply)


def _matches(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


# -- lint and validation ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, *SCOPES.values(), _merge(SCOPES["all"], EVERYTHING_ON)])
def test_helm_lint_passes(values):
    for kube in (f"v{v}" for v in K8S_VERSIONS):
        report = helm_python.lint(
            CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report


def test_every_rendered_object_passes_strict_kubernetes_validation(tmp_path):
    seen: dict[str, str] = {}  # one validation per distinct object
    for scenario, found in _scenarios(tmp_path):
        assert found, scenario
        for obj in found:
            seen.setdefault(json.dumps(obj, sort_keys=True), scenario)
    kinds = set()
    for text, scenario in seen.items():
        obj = json.loads(text)
        kinds.add(obj["kind"])
        for k8s in K8S_VERSIONS:
            if obj["kind"] in MONITORING_KINDS:
                # No schema in kubernetes-validate (prometheus-operator's CRDs): the metadata
                # is checked here, the content by the monitoring tests below.
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(obj, k8s, strict=True)
                meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
                kubernetes_validate.validate(meta, k8s, strict=True)
                continue
            try:
                kubernetes_validate.validate(obj, k8s, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = f"{scenario}: {obj['kind']}/{obj['metadata']['name']} on {k8s}"
                raise AssertionError(f"{where}: {exc.message}") from None
    expected = "CustomResourceDefinition Deployment Service ServiceAccount ClusterRole"
    expected += " ClusterRoleBinding Role RoleBinding NetworkPolicy ConfigMap Secret"
    expected += " PodDisruptionBudget"  # the gateway's
    assert kinds == {*expected.split(), *MONITORING_KINDS}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"watch": {"scope": "Everything"}}, "/watch/scope"),
        ({"watch": {"scope": "Namespaces"}}, "/watch/namespaces"),
        ({"watch": {"scope": "Namespaces", "namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
        ({"imagePullSecrets": ["regcred"]}, "/imagePullSecrets/0"),
        ({"imagePullSecret": [{"name": "regcred"}]}, "imagePullSecret"),  # a typo
        ({"image": {"tag": 1.0}}, "/image/tag"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"operator": {"metricsPort": 70000}}, "/operator/metricsPort"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"peeringLifetimeSeconds": 1}}, "/operator/peeringLifetimeSeconds"),
        ({"monitoring": {"podMonitor": {"interval": "15 seconds"}}}, "/monitoring/podMonitor"),
        ({"crds": {"enabled": "yes"}}, "/crds/enabled"),
        ({"extraObjects": [42]}, "/extraObjects/0"),
    ],
)
def test_values_schema_rejects_bad_values(values, where):
    with pytest.raises(helm_python.HelmValuesError, match=where):
        render(values)


# -- the CRD ---------------------------------------------------------------------------------


def test_crd_is_the_one_in_crds_kept_on_uninstall_and_optional():
    source = yaml.safe_load((ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml").read_text())
    rendered = copy.deepcopy(one(objects(render()), "CustomResourceDefinition"))
    meta = rendered["metadata"]
    assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert meta.pop("labels")["app.kubernetes.io/managed-by"] == "Helm"
    assert json.dumps(rendered, sort_keys=True) == json.dumps(source, sort_keys=True)
    assert of_kind(objects(render({"crds": {"enabled": False}})), "CustomResourceDefinition") == []


# -- the operator ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "namespaces"),
    [("release", [NAMESPACE]), ("namespaces", ["team-a", "team-b"]), ("all", [])],
)
def test_command_line_watches_the_scope(scope, namespaces):
    found = objects(render(SCOPES[scope]))
    container = _container(found)
    assert container["command"] == ["kvpilot"] and container["args"][0] == "operator"
    parser = argparse.ArgumentParser()
    add_operator_args(parser)  # main.py's own flags: no -n at all means every namespace
    args = parser.parse_args(container["args"][1:])
    assert args.namespace == namespaces
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.metrics_port == ports["metrics"]
    assert args.liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    service = _operator(found, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert _matches(service["spec"]["selector"], _operator_pod_labels(found))


def test_one_replica_recreated_under_restricted_pod_security():
    found = objects(render())
    deployment = _operator(found, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = _operator_pod(found)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == _operator(found, "ServiceAccount")["metadata"]["name"]
    container = _container(found)
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in volume


def test_operator_pod_is_never_selected_as_a_model_pod():
    labels = _operator_pod_labels(objects(render()))
    # A model's Service selects app.kubernetes.io/name=kvpilot, instance=<ModelDeployment>.
    assert labels["app.kubernetes.io/name"] != naming.selector_labels("x")["app.kubernetes.io/name"]


def _operator_pod_labels(found: list[dict]) -> dict:
    return _operator(found, "Deployment")["spec"]["template"]["metadata"]["labels"]


def _gateway_pod_labels(found: list[dict]) -> dict:
    return one(component(found, "gateway"), "Deployment")["spec"]["template"]["metadata"]["labels"]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_images_default_to_the_app_version_and_follow_the_global_registry():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    app = chart["appVersion"]
    assert app == version("kvpilot")  # handlers.image() tags model pods with the same version
    container = _container(objects(render()))
    assert container["image"] == f"ghcr.io/kvpilot/kvpilot:{app}-operator"
    assert _env(container)["KVPILOT_IMAGE"] == f"ghcr.io/kvpilot/kvpilot:{app}"

    values = {
        "global": {"imageRegistry": "mirror.example.com:5000"},
        "image": {"tag": "dev"},
        "modelImage": {"digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": [{"name": "regcred"}],
    }
    found = objects(render(values))
    container = _container(found)
    assert container["image"] == "mirror.example.com:5000/kvpilot/kvpilot:dev"
    model_image = "mirror.example.com:5000/kvpilot/kvpilot@sha256:" + "ab" * 32
    assert _env(container)["KVPILOT_IMAGE"] == model_image
    assert _operator_pod(found)["imagePullSecrets"] == [{"name": "regcred"}]


def test_pull_secrets_reach_the_model_pods_through_the_operator(monkeypatch):
    values = {"imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}]}
    env = _env(_container(objects(render(values))))
    monkeypatch.setenv("KVPILOT_IMAGE_PULL_SECRETS", env["KVPILOT_IMAGE_PULL_SECRETS"])
    from kvpilot_operator.handlers import pull_secrets

    assert pull_secrets() == ("regcred", "mirror")
    assert "KVPILOT_IMAGE_PULL_SECRETS" not in _env(_container(objects(render())))


def test_extra_objects_are_rendered_and_strings_are_templates():
    values = {"extraObjects": EVERYTHING_ON["extraObjects"]}
    found = objects(render(values))
    assert one(found, "ConfigMap")["metadata"]["name"] == "extra"
    assert one(found, "Secret")["metadata"]["name"] == "kvpilot-extra"


def test_notes_give_the_next_three_commands():
    text = notes(render())
    assert f"kubectl apply -n {NAMESPACE} -f -" in text
    assert f"kubectl get modeldeployments -n {NAMESPACE}" in text
    assert "kubectl port-forward" in text and "curl -s http://127.0.0.1:8000/v1/" in text
    # The sample in the notes is the CPU sample of crds/samples.
    manifest = text.split("<<'YAML'\n", 1)[1].split("  YAML\n", 1)[0]
    sample = yaml.safe_load(SAMPLE.read_text())
    assert yaml.safe_load("\n".join(line[2:] for line in manifest.splitlines())) == sample


# -- monitoring, dashboards, network policy ----------------------------------------------------


MONITORS = {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}


def test_monitoring_objects_only_where_the_api_is_served_or_asserted():
    assert not MONITORING_KINDS & {o["kind"] for o in objects(render(MONITORS))}
    assert "No ServiceMonitor was rendered" in notes(render(MONITORS))
    with_api = objects(render(MONITORS, api_versions=API))
    asserted = objects(render(_merge(MONITORS, {"monitoring": {"skipApiCheck": True}})))
    for found in (with_api, asserted):
        assert {o["kind"] for o in found} >= {"ServiceMonitor", "PodMonitor"}
    # Nothing is rendered for what is not enabled, API or not.
    assert not MONITORING_KINDS & {o["kind"] for o in objects(render(api_versions=API))}


def test_service_monitor_scrapes_the_operator_metrics_service():
    found = objects(render(MONITORS, api_versions=API))
    monitor, service = _operator(found, "ServiceMonitor"), _operator(found, "Service")
    assert _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize(
    ("scope", "selector"),
    [
        ("release", {"matchNames": [NAMESPACE]}),
        ("namespaces", {"matchNames": ["team-a", "team-b"]}),
        ("all", {"any": True}),
    ],
)
def test_pod_monitor_scrapes_model_pods_in_the_watched_namespaces(scope, selector):
    values = _merge(SCOPES[scope], MONITORS, {"monitoring": {"labels": {"release": "prom"}}})
    monitor = one(objects(render(values, api_versions=API)), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == selector
    model = one(_model_objects(), "Deployment")["spec"]["template"]
    assert _matches(monitor["spec"]["selector"]["matchLabels"], model["metadata"]["labels"])
    operator_labels = _operator_pod_labels(objects(render()))
    assert not _matches(monitor["spec"]["selector"]["matchLabels"], operator_labels)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (server,) = model["spec"]["containers"]
    assert {"name": endpoint["port"], "containerPort": PORT, "protocol": "TCP"} in server["ports"]
    assert endpoint["path"] == "/metrics"


RULES = _merge(EVERYTHING_ON, {"monitoring": {"skipApiCheck": True}})


def test_dashboards_and_alert_rules_wrap_the_files_when_there_are_any(tmp_path):
    without = objects(render(RULES, chart=chart_copy(tmp_path / "without", None)))
    assert of_kind(without, "PrometheusRule") == []
    assert [c["metadata"]["name"] for c in of_kind(without, "ConfigMap")] == ["extra"]

    found = objects(render(RULES, chart=chart_copy(tmp_path / "with", FILES)))
    rule = one(found, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS)
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    (dashboard,) = [c for c in of_kind(found, "ConfigMap") if c["metadata"]["name"] != "extra"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "kvpilot"}
    content = FILES["dashboards/Model Serving.json"].strip()
    assert dashboard["data"] == {"model-serving.json": content}

    # A whole PrometheusRule in files/alerts.yaml gives its spec.
    rule = {"apiVersion": MONITORING_API, "kind": "PrometheusRule", "spec": yaml.safe_load(ALERTS)}
    whole = yaml.safe_dump(rule)
    found = objects(render(RULES, chart=chart_copy(tmp_path / "whole", {"alerts.yaml": whole})))
    assert one(found, "PrometheusRule")["spec"] == yaml.safe_load(ALERTS)


def test_the_chart_wraps_exactly_what_the_generators_make():
    """The chart as it ships against the generators' output (scripts/generators/monitoring.py),
    not against whatever files/ holds: one ConfigMap per generated dashboard carrying its JSON,
    and the generated rule groups as the PrometheusRule's spec. A stale, stray or missing file
    in files/ fails here."""
    generated = monitoring.render()
    folder = monitoring.FILES / "dashboards"
    boards = {p.name: c.decode() for p, c in generated.items() if p.parent == folder}
    assert boards, "the generators made no dashboard"
    found = objects(render(RULES))
    maps = [c for c in of_kind(found, "ConfigMap") if c["metadata"]["name"] != "extra"]
    assert len(maps) == len(boards)
    # Each ConfigMap holds one dashboard under its file name; `|-` drops the final newline.
    data = {key: text for m in maps for key, text in m["data"].items()}
    assert data == {name: text.rstrip("\n") for name, text in boards.items()}
    rules = yaml.safe_load(generated[monitoring.FILES / "alerts.yaml"])
    assert one(found, "PrometheusRule")["spec"] == rules


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        (SCOPES["release"], [NAMESPACE]),
        (SCOPES["namespaces"], ["team-a", "team-b"]),
        (SCOPES["all"], [NAMESPACE]),
        (_merge(SCOPES["all"], {"networkPolicy": {"namespaces": ["models"]}}), ["models"]),
    ],
)
def test_network_policy_admits_only_clients_the_operator_and_prometheus(values, namespaces):
    found = objects(render(_merge(values, {"networkPolicy": {"enabled": True}})))
    operator_labels = _operator_pod_labels(found)
    (operator_policy,) = [
        p
        for p in of_kind(found, "NetworkPolicy")
        if _matches(p["spec"]["podSelector"]["matchLabels"], operator_labels)
    ]
    model = one(_model_objects(), "Deployment")["spec"]["template"]
    policies = [
        p
        for p in of_kind(found, "NetworkPolicy")
        if _matches(p["spec"]["podSelector"]["matchLabels"], model["metadata"]["labels"])
    ]
    assert [p["metadata"]["namespace"] for p in policies] == namespaces
    # The operator's pod: Prometheus only, on its metrics port (probes come from the node).
    assert operator_policy["metadata"]["namespace"] == NAMESPACE
    assert operator_policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = operator_policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    prometheus_pods = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    prometheus_namespace = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert rule["from"] == [
        {"podSelector": prometheus_pods, "namespaceSelector": prometheus_namespace}
    ]
    operator_selector = operator_policy["spec"]["podSelector"]["matchLabels"]
    assert not _matches(operator_selector, model["metadata"]["labels"])
    for policy in policies:
        spec = policy["spec"]
        assert _matches(spec["podSelector"]["matchLabels"], model["metadata"]["labels"])
        assert not _matches(spec["podSelector"]["matchLabels"], operator_labels)
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        (port,) = rule["ports"]
        (server,) = model["spec"]["containers"]
        assert {"name": port["port"], "containerPort": PORT, "protocol": "TCP"} in server["ports"]
        clients, operator, gateway, prometheus = rule["from"]
        # Labelled clients of the model's own namespace (no namespaceSelector).
        assert clients == {"podSelector": {"matchLabels": {"kvpilot.dev/client": "true"}}}
        assert _matches(operator["podSelector"]["matchLabels"], operator_labels)
        ns = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        assert operator["namespaceSelector"] == ns
        assert _matches(gateway["podSelector"]["matchLabels"], _gateway_pod_labels(found))
        assert gateway["namespaceSelector"] == ns
        assert prometheus["podSelector"] == prometheus_pods


def test_the_packaged_chart_carries_what_it_reads(tmp_path):
    archive = helm_python.package(CHART, destination=tmp_path)
    with helm_python.Chart.load(archive) as chart:
        found = objects(chart.render(name="kvpilot", namespace=NAMESPACE))
        names = {f["name"] for f in chart.files}
    assert (
        one(found, "CustomResourceDefinition")["metadata"]["name"] == "modeldeployments.kvpilot.dev"
    )
    assert [n for n in names if n.endswith(".py")] == []  # the generators stay in scripts/
