"""The chart installed with the real `helm install` (default values: watching the release
namespace) into a real API server of its own, and its life there: the operator runs as the
installed Deployment says under the chart's ServiceAccount and RBAC and serves a sample without
one refused request; the offline render the other chart tests check is what helm installs;
`helm upgrade` changes the CRD and `helm rollback` restores it; a second release elsewhere
installs beside it; `helm uninstall` keeps the CRD and the users' ModelDeployments and removes
everything else, and the same release adopts the kept CRD again."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvpilot_testing.helm import chart_copy, objects, render
from kvpilot_testing.kube.cluster import DEPLOYMENTS, MD, Cluster, wait_for
from kvpilot_testing.kube.install import (
    CHART,
    CRD_NAME,
    NAMESPACE,
    RELEASE,
    Installed,
    helm,
    wait_for_crd,
)
from kvpilot_testing.kube.node import Node
from tests.chart.live import ChartOperator, forbidden

SAMPLE = Path(__file__).parents[2] / "crds" / "samples" / "builtin-cpu.yaml"
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
# What `kubectl get modeldeployments` asks for: the CRD's printer columns as a table.
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
COLUMN = {"name": "Image", "type": "string", "jsonPath": ".spec.image"}  # the upgrade's change
MONITORING_ON = (
    "--set=monitoring.serviceMonitor.enabled=true",
    "--set=monitoring.podMonitor.enabled=true",
    "--set=monitoring.prometheusRule.enabled=true",
)
# A release's objects with its defaults, less the CRD (another release's) and the monitoring
# objects (asked for, but the API server does not serve monitoring.coreos.com/v1).
SECOND_KINDS = {"ServiceAccount", "Service", "Deployment", "Role", "RoleBinding"}
SECOND_KINDS |= {"ClusterRole", "ClusterRoleBinding", "PodDisruptionBudget"}
PATHS = {  # where each kind of the release's objects is read back
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    "Service": "/api/v1/namespaces/{ns}/services/{name}",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
}


@pytest.fixture(scope="module")
def release(chart_plane) -> Iterator[Installed]:
    with chart_plane.release() as installed:
        yield installed


@pytest.fixture
def models(release) -> Iterator[Cluster]:
    """The admin's REST calls in the release namespace, where the default scope watches."""
    cluster = Cluster(release.plane, NAMESPACE, release.operator_kubeconfig)
    try:
        yield cluster
    finally:
        cluster.close()


def _sample(name: str) -> dict:
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    return body


def _ready(models: Cluster, name: str) -> bool:
    conditions = ((models.get(MD, name) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _manifest(release: Installed) -> list[dict]:
    text = helm(release.plane, "get", "manifest", RELEASE, "-n", NAMESPACE).stdout
    return [obj for obj in yaml.safe_load_all(text) if obj]


def _path(obj: dict) -> str:
    meta = obj["metadata"]
    return PATHS[obj["kind"]].format(ns=meta.get("namespace", NAMESPACE), name=meta["name"])


def _columns(release: Installed) -> list[str]:
    crd = release.plane.get(CRD_PATH)
    assert crd is not None
    return [c["name"] for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])]


def _table_columns(models: Cluster) -> list[str]:
    response = models.http.get(models.path(MD), headers=TABLE)
    if response.status_code != 200:
        return []
    return [c["name"] for c in response.json()["columnDefinitions"]]


def test_what_helm_installs_is_what_the_offline_render_checks(release):
    # tests/chart/test_chart*.py render with Helm's Go SDK, offline: the real CLI against the
    # real server (its version, its discovery) must install the same objects.
    version = release.plane.get("/version")
    assert version is not None
    rendered = objects(render(kube_version=version["gitVersion"]))
    assert sorted(_manifest(release), key=str) == sorted(rendered, key=str)


def test_the_operator_serves_a_sample_under_the_charts_rbac(release, models, tmp_path):
    operator = ChartOperator(release, tmp_path / "operator.log")
    node = Node(models)
    try:
        operator.start()
        # The default scope: the release namespace, so kopf's namespace observer runs too.
        assert f"--namespace={NAMESPACE}" in operator.argv
        node.start()
        md = models.create(MD, _sample("sample"))
        # With the chart's env only (no faster status settings): Ready as a user would see it.
        wait_for("Ready=True", lambda: _ready(models, "sample"), timeout=40, interval=0.5)
        # kopf.adopt asks the garbage collector to block the owner's deletion: the
        # OwnerReferencesPermissionEnforcement admission plugin let that through only because
        # the chart grants modeldeployments/finalizers.
        refs = models.get(DEPLOYMENTS, "sample")["metadata"]["ownerReferences"]
        assert [(r["uid"], r.get("blockOwnerDeletion")) for r in refs] == [
            (md["metadata"]["uid"], True)
        ]
        # Deleting needs the operator too (it removes kopf's finalizer).
        models.delete(MD, "sample")
        wait_for("the ModelDeployment to go", lambda: models.get(MD, "sample") is None)
    except TimeoutError as exc:
        stuck = exc  # a step that never came: the audit log may say why, first
    else:
        stuck = None
    finally:
        node.stop()
        operator.stop()
        print(operator.log_tail(), "\nnode errors:", node.errors[-5:])  # shown on failure
    events = operator.events()
    assert len(events) > 10, "the audit log has not seen the operator"
    assert forbidden(events) == []
    if stuck is not None:
        raise stuck


def test_helm_upgrade_changes_the_crd_and_rollback_restores_it(release, models, tmp_path):
    models.create(MD, _sample("upgraded"))
    chart = chart_copy(tmp_path, {})
    crd_file = chart / "crd" / "modeldeployments.kvpilot.dev.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0]["additionalPrinterColumns"].insert(1, COLUMN)
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    before = _columns(release)
    assert COLUMN["name"] not in before

    helm(release.plane, "upgrade", RELEASE, str(chart), "-n", NAMESPACE)
    upgraded = wait_for_crd(release.plane)
    assert _columns(release) == [before[0], COLUMN["name"], *before[1:]]
    assert upgraded["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # `kubectl get modeldeployments` shows it once the API server serves the new CRD (until
    # then it answers 429, storage re-initializing, which kubectl retries), and the user's
    # object went through untouched.
    wait_for(
        "the new column in a table",
        lambda: _table_columns(models)[:3] == ["Name", *before[:1], "Image"],
    )
    assert models.get(MD, "upgraded") is not None

    helm(release.plane, "rollback", RELEASE, "1", "-n", NAMESPACE)
    wait_for("the CRD's columns to be restored", lambda: _columns(release) == before)
    models.delete(MD, "upgraded")  # no operator runs: kopf never added its finalizer


def test_a_second_release_elsewhere_installs_beside_it_without_the_monitoring_api(release):
    second = ("install", "second", str(CHART), "-n", "team-b", "--create-namespace")
    second += ("--dry-run=server", "-o", "json", *MONITORING_ON)
    # The CRD is cluster-scoped and this release's: another release may not take it...
    refused = helm(release.plane, *second, check=False)
    assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr
    # ...and with crds.enabled=false nothing else collides (cluster-scoped names carry the
    # namespace). The server serves no monitoring.coreos.com/v1: no monitoring objects.
    done = helm(release.plane, *second, "--set=crds.enabled=false")
    kinds = {o["kind"] for o in yaml.safe_load_all(yaml.safe_load(done.stdout)["manifest"]) if o}
    assert kinds == SECOND_KINDS


def test_helm_uninstall_keeps_the_crd_and_model_deployments(release, models):
    models.create(MD, _sample("kept"))
    installed = _manifest(release)
    helm(release.plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=30s")
    assert release.plane.get(CRD_PATH) is not None
    assert models.get(MD, "kept") is not None
    for obj in installed:
        if obj["kind"] != "CustomResourceDefinition":
            what = f"{obj['kind']} {obj['metadata']['name']} to go"
            wait_for(what, lambda obj=obj: release.plane.get(_path(obj)) is None, timeout=10)
    kinds = {o["kind"] for o in installed}
    assert {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"} <= kinds

    # The kept CRD still names the release: installing it again under the same name adopts it.
    helm(release.plane, "install", RELEASE, str(CHART), "-n", NAMESPACE)
    assert models.get(MD, "kept") is not None
    assert {o["kind"] for o in _manifest(release)} == kinds
