"""End to end on a real cluster (kind, k3d, a cloud cluster): the CRD, the operator, the builtin
model on CPU, Ready with an endpoint, deletion.

Runs only when KUBECONFIG points at a reachable cluster; otherwise every test here is skipped and
the summary says why. The operator runs from this checkout as a subprocess (in-cluster installs
use the Helm chart); the pods need the kvpilot image, named by KVPILOT_IMAGE.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
NAMESPACE = os.environ.get("KVPILOT_E2E_NAMESPACE", "default")


def _cluster_reason() -> str | None:
    config = os.environ.get("KUBECONFIG")
    if not config or not Path(config).exists():
        return "no real cluster: KUBECONFIG is not set (these tests need kind, k3d or similar)"
    if not os.environ.get("KVPILOT_IMAGE"):
        return "KVPILOT_IMAGE is not set: the cluster needs the kvpilot image to run pods"
    from lightkube import Client

    try:
        Client().request("get", "/version")
    except Exception as exc:  # any failure to reach it is a reason to skip, and says which
        return f"KUBECONFIG is set but the cluster is unreachable: {exc}"
    return None


REASON = _cluster_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def client():
    from lightkube import Client, codecs

    client = Client(namespace=NAMESPACE)
    crd = codecs.from_dict(
        yaml.safe_load((ROOT / "crds/modeldeployments.kvpilot.dev.yaml").read_text())
    )
    client.apply(crd, field_manager="kvpilot-e2e")
    operator = subprocess.Popen(
        [sys.executable, "-m", "kvpilot_common.cli", "operator", "-n", NAMESPACE, "--liveness", ""]
    )
    yield client
    operator.terminate()
    operator.wait(timeout=30)


def test_builtin_model_becomes_ready_and_goes_away(client):
    from lightkube import codecs
    from lightkube.generic_resource import create_namespaced_resource

    kind = create_namespaced_resource(
        "kvpilot.dev", "v1alpha1", "ModelDeployment", "modeldeployments"
    )
    body = yaml.safe_load((ROOT / "crds/samples/builtin-cpu.yaml").read_text())
    body["metadata"]["name"] = "e2e-smollm2"
    client.create(codecs.from_dict(body), namespace=NAMESPACE)
    try:
        deadline = time.monotonic() + 900  # image pull and model conversion on a CPU node
        while time.monotonic() < deadline:
            md = client.get(kind, "e2e-smollm2", namespace=NAMESPACE)
            conditions = {c["type"]: c for c in (md.status or {}).get("conditions", [])}
            if conditions.get("Ready", {}).get("status") == "True":
                break
            time.sleep(5)
        else:
            pytest.fail(f"not Ready after 15 minutes: {conditions}")
        assert md.status["endpoint"].endswith(":8000/v1")
    finally:
        client.delete(kind, "e2e-smollm2", namespace=NAMESPACE)
