"""Spec, the typed view of a defaulted spec: it reads every field the CRD has, under the same
name, and what it reads is what crd.defaulted() filled in (the view adds no defaults)."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from kvpilot_operator import crd
from kvpilot_operator.spec import Autoscaling, Spec

SAMPLES = sorted((Path(__file__).parents[2] / "crds" / "samples").glob("*.yaml"))
# Where the view's shape differs from the CRD's: spec.auth holds only apiKeySecretRef.
FLATTENED = {"auth": "api_key_secret_ref"}


def _snake(name: str) -> str:
    name = name.replace("MiB", "Mib").replace("GiB", "Gib")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _fields(view: object) -> set[str]:
    return {f.name for f in dataclasses.fields(view)}  # type: ignore[arg-type]


def _spec_schema() -> dict:
    return crd.schema()["properties"]["spec"]["properties"]


def test_every_crd_field_has_its_attribute_and_no_attribute_is_invented():
    body = crd.with_defaults({"metadata": {"name": "m"}, "spec": {"model": {"source": "x"}}})
    spec = Spec.from_defaulted(body)
    schema = _spec_schema()
    assert _fields(spec) == {FLATTENED.get(name, _snake(name)) for name in schema}
    for name, node in schema.items():
        view = getattr(spec, _snake(name), None)
        if node.get("type") == "object" and dataclasses.is_dataclass(view):
            wanted = {_snake(field) for field in node["properties"]}
            assert _fields(view) == wanted, name
            for field, child in node["properties"].items():
                nested = getattr(view, _snake(field))
                if child.get("type") == "object" and dataclasses.is_dataclass(nested):
                    assert _fields(nested) == {_snake(f) for f in child["properties"]}, field


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_the_view_holds_what_crd_defaulted_filled_in(sample):
    md = crd.defaulted(yaml.safe_load(sample.read_text()))
    spec = Spec.from_defaulted(md)
    raw = md["spec"]
    assert spec.engine.kv_cache_memory_percent == raw["engine"]["kvCacheMemoryPercent"]
    assert spec.engine.block_size == raw["engine"].get("blockSize")  # unset: the device's
    assert spec.resources.shm_mib == raw["resources"]["shmMiB"]
    assert (
        spec.autoscaling.scale_down.stabilization_seconds
        == (raw["autoscaling"]["scaleDown"]["stabilizationSeconds"])
    )
    assert spec.probes.drain_timeout_seconds == raw["probes"]["drainTimeoutSeconds"]
    assert spec.model.revision == raw["model"]["revision"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.replicas = 9  # type: ignore[misc]


def test_absent_optional_fields_are_none_and_the_derived_values():
    body = crd.with_defaults({"metadata": {"name": "m"}, "spec": {"model": {"source": "x"}}})
    spec = Spec.from_defaulted(body)
    assert spec.engine.max_model_len is None and spec.api_key_secret_ref is None
    assert spec.engine.max_num_seqs is None and spec.engine.block_size is None
    assert spec.image is None and spec.scheduling.tolerations == ()
    assert spec.tensor_parallel_size == 1  # the CRD's default of one GPU
    body["spec"]["resources"]["gpus"] = 0
    assert Spec.from_defaulted(body).tensor_parallel_size == 1
    body["spec"]["resources"]["gpus"] = 4
    assert Spec.from_defaulted(body).tensor_parallel_size == 4
    body["spec"]["engine"]["tensorParallelSize"] = 2
    assert Spec.from_defaulted(body).tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("replicas", "enabled", "desired"), [(7, False, 7), (7, True, 4), (0, True, 1), (2, True, 2)]
)
def test_desired_replicas_are_within_the_autoscalers_bounds_while_it_is_on(
    replicas, enabled, desired
):
    body = crd.with_defaults({"spec": {"model": {"source": "x"}, "replicas": replicas}})
    body["spec"]["autoscaling"]["enabled"] = enabled  # bounds: the defaults 1..4
    spec = Spec.from_defaulted(body)
    assert isinstance(spec.autoscaling, Autoscaling) and spec.desired_replicas == desired
