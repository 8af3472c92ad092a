"""status(): conditions that name the real cause, from pod objects as the kubelet and scheduler
write them; transition times that move only on flips."""

import pytest

from kvpilot_common import precision
from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_operator import crd
from kvpilot_operator.fit import Fit, check
from kvpilot_operator.render import render
from kvpilot_operator.spec import Spec
from kvpilot_operator.status import changed, is_warning, status

NOW, LATER = "2026-11-30T10:00:00Z", "2026-11-30T10:05:00Z"
FITS = Fit(True, "fits", {"sequencesAtMaxModelLen": 4})


def _body(replicas: int = 2, **spec) -> dict:
    spec = {"model": {"source": "builtin://smollm2-135m-instruct"}, "replicas": replicas, **spec}
    body = {"metadata": {"name": "m", "namespace": "ns", "generation": 3}, "spec": spec}
    return crd.with_defaults(body)


def _deployment(ready: int, updated: int, replicas: int = 2) -> dict:
    return {
        "metadata": {"generation": 5},
        "status": {
            "observedGeneration": 5,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
        },
    }


def _pod(name: str = "m-abc", **status) -> dict:
    return {"metadata": {"name": name}, "status": status}


def _status(body: dict, *observed) -> dict:
    """status() of a defaulted ModelDeployment, its spec read as the status daemon reads it."""
    return status(body, Spec.from_defaulted(body), *observed)


def _conditions(result: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result["conditions"]}


def _message(result: dict, kind: str) -> str:
    return next(c["message"] for c in result["conditions"] if c["type"] == kind)


def test_all_ready():
    result = _status(_body(), _deployment(2, 2), [], FITS, NOW)
    assert _conditions(result) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "Complete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert result["readyText"] == "2/2" and result["observedGeneration"] == 3
    assert result["selector"] == "app.kubernetes.io/instance=m,app.kubernetes.io/name=kvpilot"
    assert result["endpoint"] == "http://m.ns.svc:8000/v1"
    assert result["capacity"] == {"sequencesAtMaxModelLen": 4}


UNSCHEDULABLE = _pod(
    conditions=[
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        }
    ]
)
LOADING = _pod(containerStatuses=[{"name": "server", "ready": False, "state": {"running": {}}}])
OOM = _pod(
    containerStatuses=[
        {
            "name": "server",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
        }
    ]
)


def _exited(message: str) -> dict:
    """A server container that exited with this termination message and is backing off."""
    terminated = {"reason": "Error", "exitCode": 1, "message": message}
    return _pod(
        containerStatuses=[
            {
                "name": "server",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": terminated},
            }
        ]
    )


LOAD_FAILED = _exited("ModelLoadFailed: model path /models/x does not exist")
NO_KEYS = _exited("InvalidConfiguration: The API key file /etc/kvpilot/keys/k holds no API key")
PORT_TAKEN = _exited("StartupFailed: cannot listen on 0.0.0.0:8000")
PULL = _pod(
    containerStatuses=[
        {
            "name": "server",
            "state": {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": 'Back-off pulling image "ghcr.io/kvpilot/kvpilot:nope"',
                }
            },
        }
    ]
)
# A real kubelet's words (tests/e2e/test_real_node.py meets them).
NEVER_PULLED = _pod(
    containerStatuses=[
        {
            "name": "server",
            "state": {
                "waiting": {
                    "reason": "ErrImageNeverPull",
                    "message": 'Container image "kvpilot:local" is not present with pull policy '
                    "of Never",
                }
            },
        }
    ]
)
DOWNLOADING = _pod(initContainerStatuses=[{"name": "download", "state": {"running": {}}}])
DOWNLOAD_TIMEOUT = _pod(
    initContainerStatuses=[{"name": "download", "state": {"terminated": {"exitCode": 124}}}]
)


@pytest.mark.parametrize(
    ("pod", "reason", "text"),
    [
        (UNSCHEDULABLE, "Unschedulable", "3 Insufficient nvidia.com/gpu"),
        (OOM, "OOMKilled", "ran out of memory"),
        (LOAD_FAILED, "ModelLoadFailed", "model path /models/x does not exist"),
        (NO_KEYS, "InvalidConfiguration", "holds no API key"),
        (PORT_TAKEN, "StartupFailed", "cannot listen"),
        (PULL, "ImagePullBackOff", "kvpilot:nope"),
        (NEVER_PULLED, "ErrImageNeverPull", "not present with pull policy of Never"),
        (DOWNLOAD_TIMEOUT, "ModelDownloadFailed", "timed out"),
    ],
)
def test_faults_degrade_with_the_real_message(pod, reason, text):
    result = _status(_body(), _deployment(1, 2), [_pod("m-ok"), pod], FITS, NOW)
    assert _conditions(result) == {
        "Ready": ("False", reason),
        "Progressing": ("False", reason),
        "Degraded": ("True", reason),
    }
    assert text in _message(result, "Degraded") and "1/2 replicas ready" in _message(
        result, "Ready"
    )


@pytest.mark.parametrize(
    ("pod", "reason"), [(LOADING, "LoadingModel"), (DOWNLOADING, "DownloadingModel")]
)
def test_work_in_progress_is_progressing_not_degraded(pod, reason):
    result = _status(_body(), _deployment(1, 2), [pod], FITS, NOW)
    assert _conditions(result) == {
        "Ready": ("False", reason),
        "Progressing": ("True", reason),
        "Degraded": ("False", "AsExpected"),
    }


def test_a_model_too_big_for_the_gpu_is_degraded_with_the_numbers():
    body = _body(
        1,
        model={"source": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        resources={"gpus": 1, "gpuType": "L4"},
        engine={"maxModelLen": 8192},
    )
    fit = check(Spec.from_defaulted(body))
    assert fit.fits is False
    result = _status(body, None, [], fit, NOW)
    assert _conditions(result)["Degraded"] == ("True", "InsufficientGPUMemory")
    message = _message(result, "Degraded")
    assert "MiB of weights" in message and "23034 MiB" in message


def _seventy_b(gpus: int, **engine) -> dict:
    return _body(
        1,
        model={"source": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        resources={"gpus": gpus, "gpuType": "L4"},
        engine={"maxModelLen": 8192, "quantization": "Int4", **engine},
    )


def test_70b_in_int4_fits_four_l4s_split_four_ways_and_not_one():
    four = _seventy_b(4)
    fit = check(Spec.from_defaulted(four))
    assert fit.fits is True
    result = _status(four, None, [], fit, NOW)
    capacity = result["capacity"]
    # Per GPU: a quarter of the int4 decoder plus the bfloat16 embedding and lm_head (replicated)
    assert capacity["tensorParallelSize"] == 4 and 12000 < capacity["weightsMiB"] < 23034 - 4096
    assert capacity["sequencesAtMaxModelLen"] >= 4 and capacity["kvCacheTokens"] > 4 * 8192
    one = check(Spec.from_defaulted(_seventy_b(1)))
    assert one.fits is False and one.reason == "InsufficientGPUMemory"
    assert one.capacity["weightsMiB"] > 23034  # the weights alone exceed the whole GPU


def test_adapter_slots_tip_a_tight_fit_over_and_the_refusal_says_so():
    # SmolLM2 at 8192 tokens fits a 2 GiB CPU pod; four rank-16 slots on every projection do not.
    resources = {"gpus": 0, "memory": "2Gi"}
    bare = check(Spec.from_defaulted(_body(1, resources=resources)))
    assert bare.fits is True
    adapters = [{"name": "tone", "source": "hf://org/tone"}]
    tuned = check(Spec.from_defaulted(_body(1, resources=resources, adapters=adapters)))
    assert tuned.fits is False and tuned.reason == "InsufficientGPUMemory"
    assert "MiB of LoRA adapter slots" in tuned.message and "fewer engine.maxLoras" in tuned.message
    one_slot = _body(1, resources=resources, adapters=adapters, engine={"maxLoras": 1})
    assert check(Spec.from_defaulted(one_slot)).fits is True


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_with_the_reason():
    body = _seventy_b(4, tensorParallelSize=3)
    fit = check(Spec.from_defaulted(body))
    assert fit.fits is False
    result = _status(body, None, [], fit, NOW)
    assert _conditions(result)["Degraded"] == ("True", "InvalidTensorParallelSize")
    message = _message(result, "Degraded")
    assert "size 3 does not divide the model's 64 attention heads (choose one of 1, 2, 4, 8)" in (
        message
    )


# Catalogued for planning; the engine serves none of these architectures (yet).
UNSERVED = [
    s for s, shape in KNOWN_MODELS.items() if shape.architecture not in precision.ARCHITECTURES
]


@pytest.mark.parametrize("source", UNSERVED)
def test_a_catalogued_architecture_the_engine_does_not_serve_is_degraded_before_any_pod(source):
    # It may well fit (gemma-3-27b-it: 50 GiB of weights on an H100): that is not the question.
    body = _body(1, model={"source": source}, resources={"gpus": 1, "gpuType": "H100-80GB"})
    fit = check(Spec.from_defaulted(body))
    assert fit.fits is False and fit.capacity is None
    result = _status(body, None, [], fit, NOW)
    assert _conditions(result)["Degraded"] == ("True", "UnsupportedArchitecture")
    message = _message(result, "Degraded")
    # The engine's own words, as its pod would have said them (ModelLoadFailed), with the list.
    architecture = KNOWN_MODELS[source].architecture
    assert message.startswith(f"{source}: Unsupported model architecture '{architecture}'")
    supported = message.partition("kvpilot supports: ")[2].rstrip(".").split(", ")
    assert supported == sorted(precision.ARCHITECTURES) and "MixtralForCausalLM" in supported


def test_a_mixture_of_experts_is_sized_with_every_expert_resident():
    body = _body(
        1,
        model={"source": "hf://mistralai/Mixtral-8x7B-Instruct-v0.1"},
        resources={"gpus": 1, "gpuType": "H100-80GB"},
    )
    one = check(Spec.from_defaulted(body))
    # 46.7B parameters in bfloat16 (87 GiB), though a token uses 12.9B of them.
    assert one.fits is False and one.reason == "InsufficientGPUMemory"
    assert one.capacity["weightsMiB"] > 81559
    two = _body(
        1,
        model={"source": "hf://mistralai/Mixtral-8x7B-Instruct-v0.1"},
        resources={"gpus": 2, "gpuType": "H100-80GB"},
    )
    fit = check(Spec.from_defaulted(two))
    assert fit.fits is True and fit.capacity["tensorParallelSize"] == 2


@pytest.mark.parametrize(
    ("resources", "said"),
    [
        ({"gpus": 1, "gpuType": "A100-80GB"}, "A100-80GB is 8.0"),
        ({"gpus": 0, "memory": "8Gi"}, "on CPU use Int8"),
    ],
)
def test_fp8_where_the_engine_would_refuse_it_is_degraded_before_any_pod(resources, said):
    body = _body(1, resources=resources, engine={"kvCacheDtype": "FP8"})
    fit = check(Spec.from_defaulted(body))
    assert fit.fits is False
    result = _status(body, None, [], fit, NOW)
    assert _conditions(result)["Degraded"] == ("True", "UnsupportedPrecision")
    message = _message(result, "Degraded")
    assert "kvCacheDtype FP8 needs a GPU of compute capability 8.9+" in message and said in message
    on_h100 = _body(
        1, resources={"gpus": 1, "gpuType": "H100-80GB"}, engine={"quantization": "FP8"}
    )
    assert check(Spec.from_defaulted(on_h100)).fits is True


@pytest.mark.parametrize(
    "source", ["pvc://store/../..", "pvc://store/models//llama", "pvc://store/my model"]
)
def test_an_invalid_source_is_degraded_and_renders_no_pod(source):
    # The CRD's CEL rule refuses these, but not every API server runs CEL.
    body = _body(1, model={"source": source})
    fit = check(Spec.from_defaulted(body))
    assert fit.fits is False
    result = _status(body, None, [], fit, NOW)
    assert _conditions(result)["Degraded"] == ("True", "InvalidModelSource")
    assert "no empty, '.' or '..' segments" in _message(result, "Degraded")
    with pytest.raises(ValueError, match="must be relative"):
        render("m", "ns", Spec.from_defaulted(body), "kvpilot:test")


def test_transition_time_moves_only_when_the_status_flips():
    first = _status(_body(), _deployment(1, 2), [LOADING], FITS, NOW)
    body = _body() | {"status": first}
    second = _status(body, _deployment(1, 2), [LOADING], FITS, LATER)
    assert (
        second["conditions"] == first["conditions"]
        and changed(first["conditions"], second["conditions"]) == []
    )
    third = _status(body | {"status": second}, _deployment(2, 2), [], FITS, LATER)
    flipped = {c["type"]: c for c in changed(second["conditions"], third["conditions"])}
    assert flipped["Ready"]["lastTransitionTime"] == LATER and flipped["Ready"]["status"] == "True"
    degraded = next(c for c in third["conditions"] if c["type"] == "Degraded")
    assert degraded["lastTransitionTime"] == NOW  # still False: unchanged since the first time


def test_scaled_to_zero_and_rollout_in_progress():
    assert _conditions(_status(_body(0), _deployment(0, 0, 0), [], FITS, NOW))["Ready"] == (
        "False",
        "ScaledToZero",
    )
    rolling = _status(_body(), _deployment(2, 1), [], FITS, NOW)
    assert _conditions(rolling)["Progressing"] == ("True", "RollingOut")


@pytest.mark.parametrize(
    "kind, flag, reason, warning",
    [
        ("Ready", "True", "AllReplicasReady", False),
        ("Ready", "False", "Unschedulable", True),
        ("Ready", "False", "ScaledToZero", False),  # asked for: nothing is wrong
        ("Progressing", "True", "RollingOut", False),
        ("Progressing", "False", "Complete", False),  # a rollout finished
        ("Progressing", "False", "CrashLoopBackOff", True),
        ("Degraded", "False", "AsExpected", False),
        ("Degraded", "True", "OOMKilled", True),
    ],
)
def test_which_condition_changes_are_warnings(kind, flag, reason, warning):
    assert is_warning({"type": kind, "status": flag, "reason": reason}) is warning


def test_scaling_limited_comes_from_the_autoscalers_record_and_is_not_announced():
    body = _body(autoscaling={"enabled": True, "targetQueueDepth": 4})
    assert "ScalingLimited" not in _conditions(_status(body, _deployment(2, 2), [], FITS, NOW))
    body["status"] = {"autoscaling": {"limited": True, "reason": "no load (limited to 1..4)"}}
    result = _status(body, _deployment(2, 2), [], FITS, NOW)
    assert _conditions(result)["ScalingLimited"] == ("True", "AtBounds")
    assert _message(result, "ScalingLimited") == "no load (limited to 1..4)"
    assert [c["type"] for c in changed([], result["conditions"])] == [
        "Ready",
        "Progressing",
        "Degraded",
    ]
    body["spec"]["autoscaling"]["enabled"] = False  # off: the condition goes
    assert "ScalingLimited" not in _conditions(_status(body, _deployment(2, 2), [], FITS, NOW))
