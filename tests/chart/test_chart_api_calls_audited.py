"""permissions.py against what the operator really does: the chart installed with the real
helm into a real API server, the operator run as the chart's Deployment says under the chart's
ServiceAccount, through a life that makes each kind of call (children created and patched, a
PodDisruptionBudget and an adapter list created, changed and deleted, a scale through the
subresource, status, Events, the autoscaler), and every request it made read back from the API
server's audit log. Every call must be declared at its scope, every declaration used, and none
refused.

Both ways the chart runs it: watching named namespaces (the default, the release namespace:
a Role there, plus kopf's namespace observer cluster-wide) and watching all of them (one
ClusterRole; no namespace observer)."""

from collections.abc import Iterator

import pytest

from kvpilot_common import adapter_list
from kvpilot_operator import permissions
from kvpilot_operator.permissions import Permission
from kvpilot_testing.kube.cluster import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    MD,
    PDBS,
    Cluster,
    create_namespace,
    wait_for,
)
from kvpilot_testing.kube.install import CHART, NAMESPACE, RELEASE, Installed, helm
from tests.chart.live import (
    Call,
    ChartOperator,
    calls,
    forbidden,
    is_public,
    non_resource,
)

Key = tuple[str, str, str]  # (api group, resource[/subresource], verb)
SCOPES = {"Release": NAMESPACE, "All": "elsewhere"}  # watch.scope -> where the life happens
SPEC = {
    "model": {"source": "builtin://smollm2-135m-instruct"},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
    "replicas": 1,
    # No pod ever gets ready (no node here): the autoscaler holds at minReplicas, so it scales
    # 1 -> 2 through the scale subresource at once, and 2 replicas bring a PDB.
    "autoscaling": {
        "enabled": True,
        "minReplicas": 2,
        "maxReplicas": 3,
        "targetQueueDepth": 2,
        "intervalSeconds": 1,
        "windowSeconds": 10,
    },
}
# Checked by the OwnerReferencesPermissionEnforcement admission plugin when a child with
# blockOwnerDeletion is created, not requested by the operator: it never shows as a call.
ADMISSION_ONLY = {("kvpilot.dev", "modeldeployments/finalizers", "update")}


def _keys(declared: tuple[Permission, ...]) -> set[Key]:
    return {(p.api_group, p.resource, verb) for p in declared for verb in p.verbs}


def _key(made: Call) -> Key:
    return (made.api_group, made.resource, made.verb)


def _declared(watched: str | None) -> set[Key]:
    """What the chart grants watching `watched` (None: all namespaces)."""
    keys = _keys(permissions.NAMESPACED) | _keys(permissions.CLUSTER)
    return keys | (_keys(permissions.CLUSTER_WHEN_NAMESPACED) if watched else set())


def _allowed(made: Call, watched: str | None) -> bool:
    """Declared at its scope: namespaced permissions only in the watched namespace (anywhere,
    cluster-wide lists and watches included, watching all), the cluster ones cluster-wide."""
    key = _key(made)
    if key in _keys(permissions.NAMESPACED):
        return watched is None or made.namespace == watched
    cluster = _keys(permissions.CLUSTER)
    if watched:
        cluster |= _keys(permissions.CLUSTER_WHEN_NAMESPACED)
    return key in cluster and made.namespace is None


@pytest.fixture(scope="module")
def release(chart_plane) -> Iterator[Installed]:
    with chart_plane.release() as installed:
        yield installed


def _live(cluster: Cluster) -> None:
    """One ModelDeployment's life, each step waited for, so that each kind of call is made."""
    cluster.create(MD, {"metadata": {"name": "calls"}, "spec": SPEC})
    wait_for("the scale to 2", lambda: cluster.get(MD, "calls")["spec"]["replicas"] == 2)
    wait_for("a PDB", lambda: cluster.get(PDBS, "calls"))
    wait_for("a ScaledUp Event", lambda: "ScaledUp" in {e["reason"] for e in cluster.list(EVENTS)})
    # The children carry blockOwnerDeletion: the admission plugin checked the finalizers grant.
    refs = cluster.get(DEPLOYMENTS, "calls")["metadata"]["ownerReferences"]
    assert [r.get("blockOwnerDeletion") for r in refs] == [True]
    cluster.patch(MD, "calls", {"spec": {"autoscaling": {"enabled": False}, "replicas": 1}})
    wait_for("the PDB to go", lambda: cluster.get(PDBS, "calls") is None)
    wait_for("1 replica", lambda: cluster.get(DEPLOYMENTS, "calls")["spec"]["replicas"] == 1)
    # spec.adapters: their list is a ConfigMap, created, changed in place, deleted when emptied
    # (one slot: four would not fit beside the weights in 2 GiB).
    for names in (["tone"], ["tone", "terse"]):
        adapters = [{"name": n, "source": f"hf://org/{n}"} for n in names]
        cluster.patch(MD, "calls", {"spec": {"adapters": adapters, "engine": {"maxLoras": 1}}})
        wait_for(
            f"the list {names}",
            lambda names=names: _listed(cluster.get(CONFIGMAPS, "calls-adapters"), names),
        )
    cluster.patch(MD, "calls", {"spec": {"adapters": []}})
    wait_for("the list to go", lambda: cluster.get(CONFIGMAPS, "calls-adapters") is None)
    cluster.delete(MD, "calls")  # the operator removes kopf's finalizer
    wait_for("the ModelDeployment to go", lambda: cluster.get(MD, "calls") is None)


def _listed(config_map: dict | None, names: list[str]) -> bool:
    if config_map is None:
        return False
    text = config_map["data"][adapter_list.FILE_NAME]
    return [entry.name for entry in adapter_list.decode(text)] == names


@pytest.mark.parametrize("scope", SCOPES)
def test_every_call_is_declared_at_its_scope_and_every_declaration_used(release, scope, tmp_path):
    helm(
        release.plane, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, f"--set=watch.scope={scope}"
    )
    where = SCOPES[scope]
    watched = NAMESPACE if scope == "Release" else None
    if where != NAMESPACE:
        create_namespace(release.plane, where)
    cluster = Cluster(release.plane, where, release.operator_kubeconfig)
    operator = ChartOperator(release, tmp_path / "operator.log")
    try:
        operator.start()
        assert [a for a in operator.argv if a.startswith("--namespace")] == (
            [f"--namespace={watched}"] if watched else []
        )
        _live(cluster)
    except TimeoutError as exc:
        stuck = exc  # a step that never came: the audit log may say why, first
    else:
        stuck = None
    finally:
        operator.stop()
        cluster.close()
        print(operator.log_tail())  # shown when the test fails
    events = operator.events()
    assert forbidden(events) == []
    if stuck is not None:
        raise stuck
    assert {path for path in non_resource(events) if not is_public(path)} == set()

    made = {c for event in events for c in calls(event)}
    assert sorted(str(c) for c in made if not _allowed(c, watched)) == []
    assert _declared(watched) - {_key(c) for c in made} == ADMISSION_ONLY
