"""A ModelDeployment's spec as one typed, frozen view, built once per read from crd.defaulted():
render, the fit check and the engine flags read attributes, not strings, so a misspelt field is
an AttributeError at once rather than a KeyError on the one path that reads it.

The view adds no defaults: crd.defaulted() fills in the CRD's, which stays their one source. A
field the CRD leaves without a default is None here when absent. What the CRD passes through
unchecked (spec.scheduling's tolerations and affinity) stays the plain data it is.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str  # defaulted by the CRD: "token" for tokenSecretRef, "api-keys" for apiKeySecretRef

    @classmethod
    def of(cls, ref: Mapping[str, Any] | None) -> "SecretKeyRef | None":
        # Truthiness, not `is None`: an empty reference names no Secret.
        return cls(ref["name"], ref["key"]) if ref else None


@dataclass(frozen=True)
class SpeculativeSpec:
    method: str  # the CRD's spelling: None or Ngram
    num_speculative_tokens: int
    prompt_lookup_max: int
    prompt_lookup_min: int
    disable_by_batch_size: int

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> "SpeculativeSpec":
        return cls(
            method=spec["method"],
            num_speculative_tokens=spec["numSpeculativeTokens"],
            prompt_lookup_max=spec["promptLookupMax"],
            prompt_lookup_min=spec["promptLookupMin"],
            disable_by_batch_size=spec["disableByBatchSize"],
        )


@dataclass(frozen=True)
class ModelSpec:
    source: str
    revision: str
    download_timeout_seconds: int
    served_model_name: str | None = None
    token_secret_ref: SecretKeyRef | None = None

    @classmethod
    def of(cls, model: Mapping[str, Any]) -> "ModelSpec":
        return cls(
            source=model["source"],
            revision=model["revision"],
            download_timeout_seconds=model["downloadTimeoutSeconds"],
            served_model_name=model.get("servedModelName"),
            token_secret_ref=SecretKeyRef.of(model.get("tokenSecretRef")),
        )


@dataclass(frozen=True)
class EngineSpec:
    # Precision fields in the CRD's spelling (Auto, BFloat16, Int8...); memory_plan.py maps them
    # to the engine's rules.
    dtype: str
    quantization: str
    quantization_group_size: int
    kv_cache_dtype: str
    lm_head_quantization: str
    kv_cache_memory_percent: int
    enable_prefix_caching: bool
    max_waiting_requests: int
    max_loras: int
    max_lora_rank: int
    max_model_len: int | None = None  # None: the model's own limit
    tensor_parallel_size: int | None = None  # None: Spec.tensor_parallel_size decides
    speculative_decoding: "SpeculativeSpec | None" = None
    enforce_eager: bool = False  # GPU: no CUDA graphs
    # None: the engine's for the device (memory_plan.limits, kvpilot_common.batch_limits).
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @classmethod
    def of(cls, engine: Mapping[str, Any]) -> "EngineSpec":
        return cls(
            dtype=engine["dtype"],
            quantization=engine["quantization"],
            quantization_group_size=engine["quantizationGroupSize"],
            kv_cache_dtype=engine["kvCacheDtype"],
            lm_head_quantization=engine["lmHeadQuantization"],
            block_size=engine.get("blockSize"),
            max_num_seqs=engine.get("maxNumSeqs"),
            max_num_batched_tokens=engine.get("maxNumBatchedTokens"),
            kv_cache_memory_percent=engine["kvCacheMemoryPercent"],
            enable_prefix_caching=engine["enablePrefixCaching"],
            enforce_eager=engine["enforceEager"],
            max_waiting_requests=engine["maxWaitingRequests"],
            max_loras=engine["maxLoras"],
            max_lora_rank=engine["maxLoraRank"],
            max_model_len=engine.get("maxModelLen"),
            tensor_parallel_size=engine.get("tensorParallelSize"),
            speculative_decoding=SpeculativeSpec.of(engine["speculativeDecoding"]),
        )


@dataclass(frozen=True)
class Resources:
    gpus: int
    gpu_resource_name: str
    cpu: str  # Kubernetes quantities, as written
    memory: str
    shm_mib: int
    gpu_type: str | None = None
    gpu_memory_mib: int | None = None
    model_cache_gib: int | None = None  # None: model_cache.py derives it from the model

    @classmethod
    def of(cls, resources: Mapping[str, Any]) -> "Resources":
        return cls(
            gpus=resources["gpus"],
            gpu_resource_name=resources["gpuResourceName"],
            cpu=resources["cpu"],
            memory=resources["memory"],
            shm_mib=resources["shmMiB"],
            gpu_type=resources.get("gpuType"),
            gpu_memory_mib=resources.get("gpuMemoryMiB"),
            model_cache_gib=resources.get("modelCacheGiB"),
        )


@dataclass(frozen=True)
class ScalingPolicy:
    stabilization_seconds: int
    max_step_replicas: int

    @classmethod
    def of(cls, policy: Mapping[str, Any]) -> "ScalingPolicy":
        return cls(policy["stabilizationSeconds"], policy["maxStepReplicas"])


@dataclass(frozen=True)
class Panic:
    threshold_percent: int  # short-window arrivals, in percent of the window's, that start one
    window_seconds: int  # the short window


@dataclass(frozen=True)
class Autoscaling:
    enabled: bool
    min_replicas: int
    max_replicas: int
    latency_metric: str
    window_seconds: int
    interval_seconds: int
    tolerance_percent: int
    scale_up: ScalingPolicy
    scale_down: ScalingPolicy
    project_arrivals: bool
    panic: Panic
    target_queue_depth: int | None = None
    target_latency_p95_milliseconds: int | None = None
    replica_capacity_requests_per_minute: int | None = None

    @classmethod
    def of(cls, scaling: Mapping[str, Any]) -> "Autoscaling":
        return cls(
            enabled=scaling["enabled"],
            min_replicas=scaling["minReplicas"],
            max_replicas=scaling["maxReplicas"],
            latency_metric=scaling["latencyMetric"],
            window_seconds=scaling["windowSeconds"],
            interval_seconds=scaling["intervalSeconds"],
            tolerance_percent=scaling["tolerancePercent"],
            scale_up=ScalingPolicy.of(scaling["scaleUp"]),
            scale_down=ScalingPolicy.of(scaling["scaleDown"]),
            project_arrivals=scaling["projectArrivals"],
            panic=Panic(scaling["panic"]["thresholdPercent"], scaling["panic"]["windowSeconds"]),
            target_queue_depth=scaling.get("targetQueueDepth"),
            target_latency_p95_milliseconds=scaling.get("targetLatencyP95Milliseconds"),
            replica_capacity_requests_per_minute=scaling.get("replicaCapacityRequestsPerMinute"),
        )


@dataclass(frozen=True)
class Scheduling:
    """Passed to the pod as written: the CRD checks little of it (tolerations and affinity not at
    all), and the API server refuses what is wrong (rejection.py)."""

    node_selector: Mapping[str, str] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    runtime_class_name: str | None = None
    priority_class_name: str | None = None

    @classmethod
    def of(cls, scheduling: Mapping[str, Any] | None) -> "Scheduling":
        scheduling = scheduling or {}
        return cls(
            node_selector=scheduling.get("nodeSelector"),
            tolerations=tuple(scheduling.get("tolerations") or ()),
            affinity=scheduling.get("affinity"),
            runtime_class_name=scheduling.get("runtimeClassName"),
            priority_class_name=scheduling.get("priorityClassName"),
        )


@dataclass(frozen=True)
class Service:
    type: str
    port: int


@dataclass(frozen=True)
class Probes:
    startup_timeout_seconds: int
    drain_timeout_seconds: int


@dataclass(frozen=True)
class Adapter:
    """One of spec.adapters: a LoRA adapter served as model `name`."""

    name: str
    source: str
    revision: str

    @classmethod
    def of(cls, adapter: Mapping[str, Any]) -> "Adapter":
        return cls(adapter["name"], adapter["source"], adapter.get("revision", "main"))


@dataclass(frozen=True)
class Spec:
    model: ModelSpec
    engine: EngineSpec
    resources: Resources
    replicas: int
    autoscaling: Autoscaling
    scheduling: Scheduling
    service: Service
    probes: Probes
    api_key_secret_ref: SecretKeyRef | None = None  # spec.auth.apiKeySecretRef
    image: str | None = None  # None: the operator's own
    adapters: tuple[Adapter, ...] = ()

    @classmethod
    def from_defaulted(cls, md: Mapping[str, Any]) -> "Spec":
        """The spec of a ModelDeployment that crd.defaulted() returned (every default filled)."""
        spec = md["spec"]
        service, probes = spec["service"], spec["probes"]
        return cls(
            model=ModelSpec.of(spec["model"]),
            engine=EngineSpec.of(spec["engine"]),
            resources=Resources.of(spec["resources"]),
            replicas=spec["replicas"],
            autoscaling=Autoscaling.of(spec["autoscaling"]),
            scheduling=Scheduling.of(spec.get("scheduling")),
            service=Service(service["type"], service["port"]),
            probes=Probes(probes["startupTimeoutSeconds"], probes["drainTimeoutSeconds"]),
            api_key_secret_ref=SecretKeyRef.of((spec.get("auth") or {}).get("apiKeySecretRef")),
            image=spec.get("image") or None,  # an empty string names no image either
            adapters=tuple(Adapter.of(a) for a in spec.get("adapters") or ()),
        )

    @property
    def desired_replicas(self) -> int:
        """Replicas asked for: spec.replicas, within the autoscaler's bounds while it is on
        (the autoscaler writes spec.replicas, but a user's edit may land outside them)."""
        scaling = self.autoscaling
        if not scaling.enabled:
            return self.replicas
        return min(max(self.replicas, scaling.min_replicas), scaling.max_replicas)

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs one replica spans: engine.tensorParallelSize, by default every GPU the pod gets
        (1 on CPU). A default that depends on another field, which a schema default cannot say;
        the CRD's CEL rule on the heads applies the same one."""
        return self.engine.tensor_parallel_size or max(1, self.resources.gpus)
