"""kvpilot_common.precision is the one source of the precision rules: the CRD's enums and
defaults are its values in the CRD's spelling (exactly, both ways), every value a user can write
in a ModelDeployment reaches the engine as a flag the engine accepts, and the module loads, with
the memory model and the operator's users of it, where torch is not installed."""

import argparse
import itertools
import textwrap
from pathlib import Path

import pytest
import yaml

from kvpilot_common import precision
from kvpilot_operator import crd
from kvpilot_operator.engine_flags import engine_args
from kvpilot_operator.spec import Spec
from kvpilot_server.engine_args import add_engine_args, engine_config
from kvpilot_testing.hiding import hidden_imports, hiding_env, run_python

ROOT = Path(__file__).parents[1]
# spec.engine field -> (the rules it is spelt from, the engine's default, the EngineConfig field)
FIELDS = {
    "dtype": (precision.DTYPES, precision.DEFAULT_DTYPE, "dtype"),
    "quantization": (precision.QUANTIZATIONS, precision.DEFAULT_QUANTIZATION, "quantization"),
    "kvCacheDtype": (precision.KV_CACHE_DTYPES, precision.DEFAULT_KV_CACHE_DTYPE, "kv_cache_dtype"),
    "lmHeadQuantization": (
        precision.LM_HEAD_QUANTIZATIONS,
        precision.DEFAULT_LM_HEAD_QUANTIZATION,
        "lm_head_quantization",
    ),
}


def _engine_schemas() -> list[dict]:
    """spec.engine's schema in the CRD's source, in the chart's copy, and as the operator reads
    it (the package's link)."""
    files = [ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml"]
    files.append(ROOT / "charts" / "kvpilot" / "crd" / "modeldeployments.kvpilot.dev.yaml")
    versions = [yaml.safe_load(f.read_text())["spec"]["versions"][0] for f in files]
    schemas = [v["schema"]["openAPIV3Schema"] for v in versions] + [crd.schema()]
    return [s["properties"]["spec"]["properties"]["engine"]["properties"] for s in schemas]


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_crds_enum_is_the_rules_in_crd_spelling_both_ways(field):
    table, default, _ = FIELDS[field]
    spelling = {name: rule.crd for name, rule in table.items()}  # engine -> CRD
    back = {crd_name: rule.name for crd_name, rule in precision.by_crd(table).items()}
    assert {v: k for k, v in spelling.items()} == back  # one spelling each, both ways
    for engine in _engine_schemas():
        schema = engine[field]
        assert schema["enum"] == list(spelling.values())  # the same values, in the same order
        assert back[schema["default"]] == default


def test_the_crds_group_sizes_are_the_engines():
    for engine in _engine_schemas():
        schema = engine["quantizationGroupSize"]
        assert schema["enum"] == list(precision.INT4_GROUP_SIZES)
        assert schema["default"] == precision.INT4_DEFAULT_GROUP_SIZE


def test_the_crd_spells_every_rule_apart():
    # The operator maps spellings, it does not lowercase them; the two spellings still name the
    # same thing case-insensitively, so a user reading either recognises the other.
    for table, _, _ in FIELDS.values():
        for name, rule in table.items():
            assert rule.name == name and rule.crd.lower() == name


def _accepted_by_the_engine(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    namespace, _ = parser.parse_known_args(args)  # the rest are `kvpilot serve`'s own flags
    engine_config(namespace)  # raises ConfigError for a value the engine refuses
    return namespace


@pytest.mark.parametrize("gpus", [0, 1])
def test_every_crd_value_reaches_the_engine_as_a_value_it_accepts(gpus):
    sample = yaml.safe_load((ROOT / "crds" / "samples" / "builtin-cpu.yaml").read_text())
    enums = [_engine_schemas()[0][f]["enum"] for f in [*FIELDS, "quantizationGroupSize"]]
    for *values, group in itertools.product(*enums):
        body = crd.with_defaults(sample)
        body["spec"]["resources"]["gpus"] = gpus
        body["spec"]["engine"] |= dict(zip(FIELDS, values, strict=True))
        body["spec"]["engine"]["quantizationGroupSize"] = group
        server = _accepted_by_the_engine(engine_args(Spec.from_defaulted(body), "m"))
        for field, value in zip(FIELDS, values, strict=True):
            table, _, attribute = FIELDS[field]
            assert getattr(server, attribute) == precision.by_crd(table)[value].name
        grouped = precision.by_crd(precision.QUANTIZATIONS)[values[1]].grouped
        expected = group if grouped else precision.INT4_DEFAULT_GROUP_SIZE
        assert server.quantization_group_size == expected


def test_the_rules_load_without_torch(tmp_path):
    """The module, and what imports it on the light side (memory model, plan, the operator's fit
    check and flags), in a Python where torch and transformers are not installed."""
    env = hiding_env(tmp_path, hide={"torch", "transformers"})
    check = textwrap.dedent(
        """
        import sys
        import kvpilot_common.precision, kvpilot_common.memory_model, kvpilot_server.plan
        import kvpilot_common.catalogue
        import kvpilot_operator.fit, kvpilot_operator.engine_flags
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
        assert not heavy, heavy
        """
    )
    result = run_python(env, "-c", check)
    assert result.returncode == 0, result.stderr
    assert not {m.partition(".")[0] for m in hidden_imports(tmp_path)} & {"torch", "transformers"}


def test_fp8_needs_ada_or_newer():
    assert not precision.fp8_capable(None)  # a CPU
    assert not precision.fp8_capable((8, 6)) and not precision.fp8_capable((7, 5))
    assert precision.fp8_capable((8, 9)) and precision.fp8_capable((9, 0))
    fp8 = {name for name, rule in precision.QUANTIZATIONS.items() if rule.fp8}
    assert fp8 == {"fp8"} and precision.KV_CACHE_DTYPES["fp8"].fp8


def test_unknown_architectures_are_taken_as_llama_and_qwen2s_biases_are_fixed():
    plain = precision.layout("SomethingForCausalLM", attention_bias=False, mlp_bias=False)
    assert plain == precision.layout("LlamaForCausalLM", attention_bias=False, mlp_bias=False)
    qwen2 = precision.layout("Qwen2ForCausalLM", attention_bias=False, mlp_bias=False)
    assert qwen2.qkv_bias and not qwen2.o_bias
    assert precision.layout("Qwen2ForCausalLM", True, False) == qwen2
    assert precision.layout("Qwen3ForCausalLM", False, False).qk_norm


def test_the_torch_types_the_rules_name_have_their_sizes():
    import torch

    for name, dtype in precision.DTYPES.items():
        assert dtype.bytes is None or getattr(torch, name).itemsize == dtype.bytes
    for kv in precision.KV_CACHE_DTYPES.values():
        assert kv.storage is None or getattr(torch, kv.storage).itemsize == kv.bytes_per_element
