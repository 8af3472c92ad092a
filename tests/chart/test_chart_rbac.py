"""The chart's RBAC, evaluated as the API server's authorizer would for the operator's
ServiceAccount: it allows each permission in kvpilot_operator.permissions where the operator
needs it, and nothing else anywhere (no wildcard, nothing in unwatched namespaces, nothing
cluster-wide but the cluster-scoped reads when watching named namespaces), with one operator
replica and with several (kopf's peering object)."""

import pytest

from kvpilot_operator import permissions
from kvpilot_testing.helm import NAMESPACE, component, objects, of_kind, one, render
from tests.chart.rbac import CLUSTER, ELSEWHERE, Grant, allows, granted

SCOPES = {
    "release": ({"watch": {"scope": "Release"}}, [NAMESPACE]),
    "namespaces": ({"watch": {"scope": "Namespaces", "namespaces": ["a", "b"]}}, ["a", "b"]),
    "all": ({"watch": {"scope": "All"}}, []),
}


def _needed(namespaces: list[str], peering: bool = False) -> set[Grant]:
    """What permissions.py asks for, watching `namespaces` ([]: all of them), with kopf's
    peering (more than one replica) or without."""
    where = namespaces or [CLUSTER]
    namespaced = permissions.NAMESPACED + (permissions.PEERING if peering and namespaces else ())
    needed = {
        Grant(p.api_group, p.resource, verb, ns)
        for p in namespaced
        for verb in p.verbs
        for ns in where
    }
    cluster = permissions.CLUSTER + (permissions.CLUSTER_WHEN_NAMESPACED if namespaces else ())
    cluster += permissions.PEERING_CLUSTER if peering and not namespaces else ()
    needed |= {Grant(p.api_group, p.resource, v, CLUSTER) for p in cluster for v in p.verbs}
    return needed


# One operator replica (standalone), or two (kopf's peering object too).
REPLICAS = pytest.mark.parametrize("replicas", [1, 2])


@REPLICAS
@pytest.mark.parametrize("scope", SCOPES)
def test_rbac_allows_every_declared_permission_where_it_is_needed(scope, replicas):
    values, namespaces = SCOPES[scope]
    grants = granted(objects(render({**values, "operator": {"replicas": replicas}})))
    needed = _needed(namespaces, peering=replicas > 1)
    missing = [want for want in sorted(needed, key=str) if not allows(grants, want)]
    assert missing == []


@REPLICAS
@pytest.mark.parametrize("scope", SCOPES)
def test_rbac_allows_nothing_more(scope, replicas):
    values, namespaces = SCOPES[scope]
    grants = granted(objects(render({**values, "operator": {"replicas": replicas}})))
    # So no wildcard, nothing undeclared, and no peering object with one replica.
    assert grants == _needed(namespaces, peering=replicas > 1)
    if namespaces:
        for p in permissions.NAMESPACED + permissions.PEERING:
            for verb in p.verbs:
                want = Grant(p.api_group, p.resource, verb, ELSEWHERE)
                assert not allows(grants, want), want


def test_watching_named_namespaces_grants_only_cluster_scoped_reads_cluster_wide():
    for scope in ("release", "namespaces"):
        found = objects(render(SCOPES[scope][0]))
        cluster_wide = {g for g in granted(found) if g.namespace is CLUSTER}
        assert {(g.resource, g.verb) for g in cluster_wide} == {
            ("customresourcedefinitions", "list"),
            ("customresourcedefinitions", "watch"),
            ("namespaces", "list"),
            ("namespaces", "watch"),
        }
        (cluster_role,) = of_kind(found, "ClusterRole")
        for rule in cluster_role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}


def test_the_bindings_name_the_operators_service_account_in_the_release_namespace():
    found = objects(render(SCOPES["namespaces"][0]))
    account = one(component(found, "operator"), "ServiceAccount")["metadata"]
    assert account["namespace"] == NAMESPACE
    ours = component(found, "operator")
    bindings = of_kind(ours, "RoleBinding") + of_kind(ours, "ClusterRoleBinding")
    assert len(bindings) == 3  # a and b, and the cluster-scoped reads
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
        ]


def test_rbac_can_be_left_to_someone_else():
    values = {
        "rbac": {"create": False},
        "serviceAccount": {"create": False},
        "gateway": {"serviceAccount": {"create": False}},
    }
    found = objects(render(values))
    kinds = {o["kind"] for o in found}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert "ServiceAccount" not in kinds
    for deployment in of_kind(found, "Deployment"):
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "default"
