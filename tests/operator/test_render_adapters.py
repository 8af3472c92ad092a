"""spec.adapters rendered: the adapter list as a ConfigMap the pod mounts and the server follows
(so a changed list leaves the pod template as it was), the claims of pvc:// adapters, where each
adapter's files are, and what the server's own parser makes of the flags."""

import copy

import yaml

from kvpilot_common import adapter_list
from kvpilot_operator import crd
from kvpilot_operator.render import Removal, render
from kvpilot_operator.spec import Spec
from tests.operator.crd_cases import SAMPLES
from tests.operator.server_flags import server_reads

IMAGE = "ghcr.io/kvpilot/kvpilot:0.1.0"
SAMPLE = next(s for s in SAMPLES if s.name == "lora-adapters.yaml")


def _body() -> dict:
    obj = crd.with_defaults(yaml.safe_load(SAMPLE.read_text()))
    obj["metadata"]["namespace"] = "models"
    return obj


def _plan(body: dict):
    return render(body["metadata"]["name"], "models", Spec.from_defaulted(body), IMAGE)


def _kinds(plan) -> dict[str, dict]:
    return {o["kind"]: o for o in plan.apply}


def test_the_adapter_list_is_a_configmap_the_server_follows(monkeypatch):
    plan = _plan(_body())
    objects = _kinds(plan)
    listed = adapter_list.decode(objects["ConfigMap"]["data"][adapter_list.FILE_NAME])
    assert objects["ConfigMap"]["metadata"]["name"] == "smollm2-tuned-adapters"
    assert listed == [
        adapter_list.Entry(
            "support-tone", "pvc://adapters/smollm2/support-tone",
            "/adapters/adapters/smollm2/support-tone",
        ),
        adapter_list.Entry(
            "sql-helper", "hf://example-org/smollm2-sql-lora",
            "/var/cache/kvpilot/adapters/example-org/smollm2-sql-lora",
        ),
    ]  # fmt: skip
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["adapter-list"]["configMap"]["name"] == "smollm2-tuned-adapters"
    assert volumes["adapters-0"]["persistentVolumeClaim"] == {
        "claimName": "adapters",
        "readOnly": True,
    }
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/adapters/adapters"]["readOnly"] and mounts["/etc/kvpilot/adapters"]["readOnly"]
    server = server_reads(pod["containers"][0]["args"], monkeypatch)
    assert server.lora_config == "/etc/kvpilot/adapters/adapters.json"
    assert (server.max_loras, server.max_lora_rank) == (2, 16)
    assert Removal("ConfigMap", "smollm2-tuned-adapters", "models") not in plan.delete


def test_changing_the_adapters_changes_the_list_not_the_pod_template():
    body = _body()
    changed = copy.deepcopy(body)
    changed["spec"]["adapters"].append(
        {"name": "third", "source": "pvc://adapters/smollm2/third", "revision": "main"}
    )
    changed["spec"]["adapters"].pop(1)  # an hf:// one removed
    before, after = _kinds(_plan(body)), _kinds(_plan(changed))
    template = "spec", "template"
    assert before["Deployment"]["spec"]["template"] == after["Deployment"]["spec"]["template"]
    assert before["ConfigMap"]["data"] != after["ConfigMap"]["data"]
    names = [e.name for e in adapter_list.decode(after["ConfigMap"]["data"]["adapters.json"])]
    assert names == ["support-tone", "third"] and template


def test_an_adapter_on_the_models_own_claim_uses_its_mount_and_no_adapters_no_list():
    body = _body()
    body["spec"]["model"]["source"] = "pvc://adapters/base"
    body["spec"]["adapters"] = [{"name": "a", "source": "pvc://adapters/a", "revision": "main"}]
    objects = _kinds(_plan(body))
    (entry,) = adapter_list.decode(objects["ConfigMap"]["data"]["adapters.json"])
    assert entry.path == "/models/a"
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert not any(v["name"].startswith("adapters-") for v in pod["volumes"])
    body["spec"]["adapters"] = []
    plan = _plan(body)
    assert "ConfigMap" not in _kinds(plan)
    assert Removal("ConfigMap", "smollm2-tuned-adapters", "models") in plan.delete
    args = _kinds(plan)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--lora-config") for a in args)
