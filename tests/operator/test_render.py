"""render(): every object passes the official Kubernetes schemas (strict), and the pod spec says
what the issue asks: probes sized for loading, drain on stop, hardening, GPU limits, flags."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kvpilot_operator import crd
from kvpilot_operator.render import Removal, render
from kvpilot_operator.spec import Spec
from tests.operator.crd_cases import SAMPLES
from tests.operator.server_flags import server_reads

# The oldest version we support (PreStop sleep needs 1.30) and the newest the package knows.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
IMAGE = "ghcr.io/kvpilot/kvpilot:0.1.0"


def _body(sample: Path) -> dict:
    obj = crd.with_defaults(yaml.safe_load(sample.read_text()))
    obj["metadata"].setdefault("namespace", "models")
    return obj


def _render(body: dict, image: str = IMAGE, pull_secrets: tuple[str, ...] = ()) -> list[dict]:
    """What render() applies for a defaulted ModelDeployment."""
    meta = body["metadata"]
    plan = render(meta["name"], meta["namespace"], Spec.from_defaulted(body), image, pull_secrets)
    return list(plan.apply)


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_rendered_objects_pass_strict_kubernetes_validation(sample, version):
    for obj in _render(_body(sample)):
        kubernetes_validate.validate(obj, version, strict=True)


def _pod(objects: list[dict]) -> dict:
    return _by_kind(objects)["Deployment"]["spec"]["template"]["spec"]


def _flags(args: list[str]) -> dict[str, str]:
    """The server's --flag=value args as a dict (after `serve`)."""
    return dict(a.split("=", 1) for a in args[1:] if "=" in a)


def test_builtin_cpu_sample():
    objects = _render(_body(SAMPLES[0]))
    assert sorted(_by_kind(objects)) == ["Deployment", "Service"]  # one replica: no PDB
    pod = _pod(objects)
    (server,) = pod["containers"]
    args = server["args"]
    flag = _flags(args)
    assert args[0] == "serve" and flag["--model"] == "builtin://smollm2-135m-instruct"
    assert flag["--device"] == "cpu" and int(flag["--kv-cache-bytes"]) > 1 << 30
    assert flag["--served-model-name"] == "smollm2" and flag["--max-model-len"] == "2048"
    assert "nvidia.com/gpu" not in server["resources"]["limits"]
    # Loading may take long: the startup probe allows it; liveness only starts afterwards.
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    # Drain: preStop, then SIGTERM, then drainTimeoutSeconds to finish in-flight requests.
    assert pod["terminationGracePeriodSeconds"] > int(flag["--drain-timeout"])
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert server["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in server["volumeMounts"]}
    assert {"/dev/shm", "/tmp", "/var/cache/kvpilot"} <= mounts


def test_hf_gpu_sample_downloads_first_and_asks_for_a_gpu():
    body = _body(next(s for s in SAMPLES if s.name.startswith("hf-")))
    objects = _render(body)
    pod = _pod(objects)
    (download,) = pod["initContainers"]
    assert download["command"][:3] == ["timeout", "3600", "hf"]
    assert "Qwen/Qwen2.5-7B-Instruct" in download["command"]
    token = next(e for e in download["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    (server,) = pod["containers"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    flag = _flags(server["args"])
    assert flag["--model"] == "/var/cache/kvpilot/models/Qwen/Qwen2.5-7B-Instruct"
    assert flag["--quantization"] == "int8"
    assert "--quantization-group-size" not in flag  # int4 only
    assert flag["--api-key-file"] == "/etc/kvpilot/keys/api-keys"
    body["spec"]["engine"] |= {"quantization": "Int4", "quantizationGroupSize": 64}
    flag = _flags(_pod(_render(body))["containers"][0]["args"])
    assert flag["--quantization"] == "int4" and flag["--quantization-group-size"] == "64"
    deployment = _by_kind(objects)["Deployment"]
    assert deployment["spec"]["replicas"] == 1  # autoscaling: within min and max


def test_a_replica_over_four_gpus_runs_four_ranks_with_a_memory_backed_shm():
    body = _body(next(s for s in SAMPLES if s.name.startswith("hf-")))
    body["spec"]["resources"] |= {"gpus": 4}
    pod = _pod(_render(body))
    (server,) = pod["containers"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert _flags(server["args"])["--tensor-parallel-size"] == "4"
    (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["medium"] == "Memory"  # NCCL's buffers between the ranks
    assert {"name": "shm", "mountPath": "/dev/shm"} in server["volumeMounts"]
    body["spec"]["engine"]["tensorParallelSize"] = 2
    assert _flags(_pod(_render(body))["containers"][0]["args"])["--tensor-parallel-size"] == "2"


def test_pvc_sample_mounts_the_claim_and_schedules_as_asked():
    body = _body(next(s for s in SAMPLES if s.name.startswith("pvc-")))
    objects = _render(body)
    kinds = _by_kind(objects)
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1  # two replicas
    pod = _pod(objects)
    claim = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["priorityClassName"] == "inference-high"
    flag = _flags(pod["containers"][0]["args"])
    assert flag["--model"] == "/models/llama-3.1-8b-instruct" and flag["--kv-cache-dtype"] == "fp8"


@pytest.mark.parametrize(("replicas", "budget"), [(0, False), (1, False), (2, True), (3, True)])
def test_a_pod_disruption_budget_only_above_one_replica_and_deleted_below(replicas, budget):
    body = _body(SAMPLES[0])
    body["spec"]["replicas"] = replicas
    plan = render("m", "models", Spec.from_defaulted(body), IMAGE)
    assert [o["kind"] for o in plan.apply][:2] == ["Deployment", "Service"]  # Deployment first
    gone = Removal("PodDisruptionBudget", "m", "models")
    if budget:
        assert plan.apply[-1]["kind"] == "PodDisruptionBudget" and gone not in plan.delete
    else:
        assert len(plan.apply) == 2 and gone in plan.delete


def test_autoscaling_bounds_the_replicas_a_budget_is_decided_on():
    body = _body(SAMPLES[0])
    body["spec"]["replicas"] = 1
    body["spec"]["autoscaling"] |= {"enabled": True, "minReplicas": 2, "targetQueueDepth": 4}
    plan = render("m", "models", Spec.from_defaulted(body), IMAGE)
    assert plan.apply[0]["spec"]["replicas"] == 2  # raised to minReplicas
    assert plan.apply[-1]["kind"] == "PodDisruptionBudget"
    assert [r.kind for r in plan.delete] == ["ConfigMap"]  # no adapters: no adapter list


def test_render_is_deterministic_and_a_spec_change_changes_the_pod_template():
    body = _body(SAMPLES[0])
    assert _render(body) == _render(body)
    changed = crd.with_defaults(body)
    changed["spec"]["engine"]["maxNumSeqs"] = 8
    before = _by_kind(_render(body))["Deployment"]["spec"]["template"]
    after = _by_kind(_render(changed))["Deployment"]["spec"]["template"]
    assert before != after


def test_the_servers_parser_reads_every_user_value_as_a_value(monkeypatch):
    # A CRD older than the operator lets a name starting with '-' through; the server must
    # still start (argparse read `--served-model-name -x` as two flags and exited: a crash loop).
    body = _body(next(s for s in SAMPLES if s.name.startswith("hf-")))
    body["spec"]["model"]["servedModelName"] = "--help"
    pod = _pod(_render(body))
    server = server_reads(pod["containers"][0]["args"], monkeypatch)
    assert server.served_model_name == "--help" and server.quantization == "int8"
    assert server.model == "/var/cache/kvpilot/models/Qwen/Qwen2.5-7B-Instruct"
    assert server.enable_prefix_caching is True and server.device == "cuda"
    assert server.enforce_eager is False  # CUDA graphs unless asked otherwise
    eager = crd.with_defaults(body)
    eager["spec"]["engine"]["enforceEager"] = True
    eager_args = _pod(_render(eager))["containers"][0]["args"]
    assert server_reads(eager_args, monkeypatch).enforce_eager is True
    body["spec"]["model"]["revision"] = "-rev"
    download = _pod(_render(body))["initContainers"][0]["command"]
    assert "--revision=-rev" in download and "-rev" not in download


def test_spec_image_overrides_the_operators_own_in_every_container():
    body = _body(next(s for s in SAMPLES if s.name.startswith("hf-")))
    body["spec"]["image"] = "registry.example.com/kvpilot:patched"
    pod = _pod(_render(body))
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert images == {"registry.example.com/kvpilot:patched"}
    del body["spec"]["image"]
    pod = _pod(_render(body))
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {IMAGE}


def _size_limits(body: dict) -> dict[str, str]:
    volumes = _pod(_render(body))["volumes"]
    return {v["name"]: v["emptyDir"].get("sizeLimit") for v in volumes if "emptyDir" in v}


@pytest.mark.parametrize(
    ("source", "cache"),
    [
        ("builtin://smollm2-135m-instruct", "3Gi"),  # converted to float32 in the cache
        ("hf://Qwen/Qwen2.5-7B-Instruct", "38Gi"),  # 15 GB of bfloat16, with room for twice that
        ("hf://meta-llama/Llama-3.1-70B-Instruct", "331Gi"),
        ("hf://someone/unknown-model", "100Gi"),  # not catalogued: a default
        ("pvc://store/llama", "2Gi"),  # the weights stay on the claim
    ],
)
def test_every_emptydir_has_a_size_limit_the_model_fits_in(source, cache):
    body = _body(SAMPLES[0])
    body["spec"]["model"]["source"] = source
    limits = _size_limits(body)
    assert limits == {"shm": "1024Mi", "tmp": "1Gi", "model-cache": cache}
    body["spec"]["resources"]["modelCacheGiB"] = 500
    assert _size_limits(body)["model-cache"] == "500Gi"


def test_model_pods_pull_with_the_operators_pull_secrets():
    """The chart's imagePullSecrets reach the operator as KVPILOT_IMAGE_PULL_SECRETS and every
    model pod names them, so a private registry serves model images too."""
    body = _body(SAMPLES[0])
    assert "imagePullSecrets" not in _pod(_render(body))
    pod = _pod(_render(body, IMAGE, ("regcred", "mirror")))
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
