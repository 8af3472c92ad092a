"""The chart's gateway (`kvpilot gateway`): its Deployment's command line against the gateway's own
flags, probes and drain, its own ServiceAccount and exactly permissions.GATEWAY in the watched
namespaces, its Service, PodDisruptionBudget, ServiceMonitor and NetworkPolicy, the values
schema, and nothing of it when gateway.enabled is false."""

import argparse
import json

import helm_python
import kubernetes_validate
import pytest

from kvpilot_common import naming
from kvpilot_gateway import options
from kvpilot_gateway.options import ROUTING, add_gateway_args
from kvpilot_operator import permissions
from kvpilot_testing.helm import (
    MONITORING_API,
    NAMESPACE,
    component,
    notes,
    objects,
    of_kind,
    one,
    render,
)
from kvpilot_testing.paths import CHART
from tests.chart.rbac import CLUSTER, ELSEWHERE, Grant, allows, granted

SCOPES = {
    "release": ({"watch": {"scope": "Release"}}, [NAMESPACE]),
    "namespaces": ({"watch": {"scope": "Namespaces", "namespaces": ["a", "b"]}}, ["a", "b"]),
    "all": ({"watch": {"scope": "All"}}, []),
}
KEYS = {"gateway": {"apiKeySecretRef": {"name": "gateway-keys", "key": "keys.txt"}}}


def _gateway(found: list[dict], kind: str) -> dict:
    return one(component(found, "gateway"), kind)


def _pod(found: list[dict]) -> dict:
    return _gateway(found, "Deployment")["spec"]["template"]["spec"]


def _container(found: list[dict]) -> dict:
    (container,) = _pod(found)["containers"]
    return container


def _args(container: dict) -> argparse.Namespace:
    """The container's command line read by the gateway's own parser (options.py)."""
    assert container["command"] == ["kvpilot"] and container["args"][0] == "gateway"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_gateway_args(parser)
    return parser.parse_args(container["args"][1:])


def _labels(found: list[dict], part: str) -> dict:
    deployment = one(component(found, part), "Deployment")
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_disabled_renders_no_gateway_anywhere():
    values = {"gateway": {"enabled": False}, "networkPolicy": {"enabled": True}}
    values["monitoring"] = {"skipApiCheck": True, "serviceMonitor": {"enabled": True}}
    found = objects(render(values))
    assert component(found, "gateway") == []
    assert "kvpilot-gateway" not in str(found)  # no policy admits it, no monitor scrapes it
    assert "gateway" not in notes(render(values))


@pytest.mark.parametrize("scope", SCOPES)
def test_command_line_follows_the_values_and_the_watch_scope(scope):
    values, namespaces = SCOPES[scope]
    gateway = {
        "port": 9000,
        "routing": "least-load",
        "maxHeldPerModel": 8,
        "maxHeld": 100,
        "holdTimeoutSeconds": 600,
        "drainTimeoutSeconds": 45,
        "extraArgs": ["--load-factor=1.5"],
        "env": [{"name": "EXTRA", "value": "1"}],
    }
    found = objects(render({**values, "gateway": gateway}))
    container = _container(found)
    args = _args(container)
    assert args.namespace == namespaces  # none: every namespace, as the operator
    assert (args.host, args.port, args.routing) == ("0.0.0.0", 9000, "least-load")
    assert (args.max_held_per_model, args.max_held) == (8, 100)
    assert (args.hold_timeout, args.drain_timeout, args.load_factor) == (600, 45, 1.5)
    assert args.api_key_file is None
    assert container["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    env = {e["name"]: e for e in container["env"]}
    # --gateway-id defaults to $POD_NAME: each replica owns its held-requests annotation.
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["EXTRA"]["value"] == "1"
    operator = one(component(found, "operator"), "Deployment")["spec"]["template"]["spec"]
    assert container["image"] == operator["containers"][0]["image"]  # the operator image
    assert _args(_container(objects(render()))).routing == ROUTING[0]


def test_probes_drain_and_restricted_pod_security():
    found = objects(render({"gateway": {"drainTimeoutSeconds": 90}}))
    pod, container = _pod(found), _container(found)
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    # preStop, then SIGTERM and up to --drain-timeout: the grace period covers both.
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pause + _args(container).drain_timeout
    operator = one(component(found, "operator"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == operator["securityContext"]
    assert container["securityContext"] == operator["containers"][0]["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts
    deployment = _gateway(found, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_api_keys_come_from_the_secret_as_a_file():
    found = objects(render(KEYS))
    pod, container = _pod(found), _container(found)
    key_file = _args(container).api_key_file
    (mount,) = [m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "gateway-keys"
    (item,) = volume["secret"]["items"]
    assert item["key"] == "keys.txt" and key_file == f"{mount['mountPath']}/{item['path']}"
    assert 'Authorization: Bearer $KVPILOT_API_KEY"' in notes(render(KEYS))
    for obj in component(found, "gateway"):
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_own_service_account_and_a_service_that_selects_only_the_gateway():
    found = objects(render())
    account = _gateway(found, "ServiceAccount")["metadata"]["name"]
    assert _pod(found)["serviceAccountName"] == account
    assert account != one(component(found, "operator"), "ServiceAccount")["metadata"]["name"]
    service = _gateway(found, "Service")
    selector = service["spec"]["selector"]
    assert selector.items() <= _labels(found, "gateway").items()
    assert not selector.items() <= _labels(found, "operator").items()
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (80, "http")
    # Neither a model's Service nor the operator's selects the gateway's pods.
    model = naming.selector_labels("kvpilot-gateway")
    assert not model.items() <= _labels(found, "gateway").items()
    operator_service = one(component(found, "operator"), "Service")["spec"]["selector"]
    assert not operator_service.items() <= _labels(found, "gateway").items()
    assert "svc/kvpilot-gateway 8080:80" in notes(render())


def _needed(namespaces: list[str]) -> set[Grant]:
    where = namespaces or [CLUSTER]
    return {
        Grant(p.api_group, p.resource, verb, ns)
        for p in permissions.GATEWAY
        for verb in p.verbs
        for ns in where
    }


@pytest.mark.parametrize("scope", SCOPES)
def test_rbac_grants_exactly_the_declared_permissions_where_it_watches(scope):
    values, namespaces = SCOPES[scope]
    found = objects(render(values))
    grants = granted(found, "gateway")
    assert grants == _needed(namespaces)  # no wildcard, nothing undeclared, nothing missing
    roles = of_kind(component(found, "gateway"), "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    for p in permissions.GATEWAY:
        if namespaces:
            assert not allows(grants, Grant(p.api_group, p.resource, p.verbs[0], ELSEWHERE))


def test_pod_disruption_budget_above_one_replica():
    found = objects(render())
    budget = _gateway(found, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= _labels(found, "gateway").items()
    for values in ({"replicas": 1}, {"podDisruptionBudget": {"enabled": False}}):
        found = objects(render({"gateway": values}))
        assert of_kind(component(found, "gateway"), "PodDisruptionBudget") == []


def test_service_monitor_scrapes_the_gateway_with_the_operator():
    values = {"monitoring": {"serviceMonitor": {"enabled": True}, "labels": {"release": "p"}}}
    found = objects(render(values, api_versions=(MONITORING_API,)))
    monitor, service = _gateway(found, "ServiceMonitor"), _gateway(found, "Service")
    assert monitor["metadata"]["labels"]["release"] == "p"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


def test_network_policy_admits_clients_extra_peers_and_prometheus_on_its_port():
    ingress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
    values = {"networkPolicy": {"enabled": True, "gatewayClients": [ingress]}}
    found = objects(render(values))
    policy = _gateway(found, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= _labels(found, "gateway").items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    clients, extra, prometheus = rule["from"]
    # Labelled clients of the release namespace (clients.namespaceSelector is null).
    assert clients == {"podSelector": {"matchLabels": {"kvpilot.dev/client": "true"}}}
    assert extra == ingress
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def test_hardening_values_reach_the_command_line():
    gateway = {
        "maxHeldBytes": 1 << 20,
        "maxHeldBytesPerTenant": 1 << 20,
        "headerTimeoutSeconds": 5,
        "bodyTimeoutSeconds": 7,
        "upstreamTimeoutSeconds": 900,
        "upstreamIdleTimeoutSeconds": 60,
        "reservedNames": {"meta-llama/*": ["team-a", "team-b"], "*-prod": ["prod"]},
        "preferNamespaces": ["prod", "staging"],
        "trustedProxies": ["10.0.0.0/8", "fd00::/8"],
    }
    args = _args(_container(objects(render({"gateway": gateway}))))
    assert (args.max_held_bytes, args.header_timeout, args.body_timeout) == (1 << 20, 5, 7)
    assert args.max_held_bytes_per_tenant == 1 << 20
    assert (args.upstream_timeout, args.upstream_idle_timeout) == (900, 60)
    assert sorted(args.reserve) == ["*-prod=prod", "meta-llama/*=team-a,team-b"]
    assert args.prefer_namespace == ["prod", "staging"]
    assert args.trusted_proxy == ["10.0.0.0/8", "fd00::/8"]
    settings = options.settings(args, [])  # the gateway accepts what the chart renders
    assert settings.names.prefer == ("prod", "staging")
    defaults = _args(_container(objects(render())))
    assert (defaults.reserve, defaults.prefer_namespace, defaults.trusted_proxy) == ([], [], [])
    assert defaults.max_held_bytes == options.Settings().max_held_bytes
    assert defaults.max_held_bytes_per_tenant is None  # the gateway's own default: a quarter
    assert options.settings(defaults, []).max_held_bytes_per_tenant == 8 << 20


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"reservedNames": {"meta-llama/*": []}}, "/gateway/reservedNames"),
        ({"reservedNames": {"x": ["Bad_NS"]}}, "/gateway/reservedNames"),
        ({"preferNamespaces": ["Bad_NS"]}, "/gateway/preferNamespaces/0"),
        ({"trustedProxies": ["not a cidr"]}, "/gateway/trustedProxies/0"),
        ({"headerTimeoutSeconds": 0}, "/gateway/headerTimeoutSeconds"),
        ({"routing": "random"}, "/gateway/routing"),
        ({"replicas": 0}, "/gateway/replicas"),
        ({"holdTimeoutSeconds": 0}, "/gateway/holdTimeoutSeconds"),
        ({"maxHeld": -1}, "/gateway/maxHeld"),
        ({"port": 0}, "/gateway/port"),
        ({"apiKeySecretRef": {"name": "Bad_Name"}}, "/gateway/apiKeySecretRef/name"),
        ({"extraArgs": ["load-factor"]}, "/gateway/extraArgs/0"),
        ({"service": {"type": "Ingress"}}, "/gateway/service/type"),
        ({"replica": 3}, "replica"),  # a typo
    ],
)
def test_values_schema_rejects_bad_gateway_values(values, where):
    with pytest.raises(helm_python.HelmValuesError, match=where):
        render({"gateway": values})


def test_routing_choices_are_the_gateways():
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["gateway"]["properties"]["routing"]["enum"]
    assert tuple(enum) == ROUTING
    for routing in ROUTING:
        found = objects(render({"gateway": {"routing": routing}}))
        assert _args(_container(found)).routing == routing


def test_the_gateway_secret_reaches_the_gateway_and_through_the_operator_the_model_pods(
    monkeypatch,
):
    from kvpilot_common import trust
    from kvpilot_operator import crd, handlers
    from kvpilot_operator.render import render as render_model
    from kvpilot_operator.spec import Spec
    from tests.operator.crd_cases import BASE

    values = {"gateway": {"secretRef": {"name": "kvpilot-gateway", "key": "token"}}}
    found = objects(render(values))
    env = {e["name"]: e for e in _container(found)["env"]}
    assert env[trust.ENV]["valueFrom"]["secretKeyRef"] == {
        "name": "kvpilot-gateway",
        "key": "token",
    }
    (operator,) = [
        c
        for d in of_kind(found, "Deployment")
        if d not in component(found, "gateway")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    ref = {e["name"]: e.get("value") for e in operator["env"]}["KVPILOT_GATEWAY_SECRET_REF"]
    monkeypatch.setenv("KVPILOT_GATEWAY_SECRET_REF", ref)
    secret = handlers.gateway_secret()
    assert secret == ("kvpilot-gateway", "token")
    spec = Spec.from_defaulted(crd.with_defaults(BASE))
    plan = render_model("m", "team", spec, "img", (), secret)
    (server,) = plan.apply[0]["spec"]["template"]["spec"]["containers"]
    model_env = {e["name"]: e for e in server["env"]}
    assert model_env[trust.ENV]["valueFrom"]["secretKeyRef"] == {
        "name": "kvpilot-gateway",
        "key": "token",
        "optional": True,  # a model namespace without it still serves
    }
    # Without it: no variable anywhere.
    plain = objects(render())
    assert trust.ENV not in {e["name"] for e in _container(plain)["env"]}
    monkeypatch.delenv("KVPILOT_GATEWAY_SECRET_REF")
    assert handlers.gateway_secret() is None
