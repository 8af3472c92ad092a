"""kvpilot_common.speculative is the one source of speculative decoding's settings: the CRD's
enum and defaults are its values, the engine's defaults are the same, and a ModelDeployment's
speculativeDecoding reaches the engine as flags it accepts (none at all while it is off)."""

import argparse
from pathlib import Path

import yaml

from kvpilot_common import speculative
from kvpilot_operator import crd
from kvpilot_operator.engine_flags import engine_args
from kvpilot_operator.spec import Spec
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine_args import add_engine_args, engine_config

ROOT = Path(__file__).parents[1]
# CRD field -> (the shared default, the EngineConfig field)
FIELDS = {
    "numSpeculativeTokens": (speculative.DEFAULT_NUM_TOKENS, "num_speculative_tokens"),
    "promptLookupMax": (speculative.DEFAULT_LOOKUP_MAX, "prompt_lookup_max"),
    "promptLookupMin": (speculative.DEFAULT_LOOKUP_MIN, "prompt_lookup_min"),
    "disableByBatchSize": (
        speculative.DEFAULT_DISABLE_BY_BATCH_SIZE,
        "speculative_disable_by_batch_size",
    ),
}


def _schemas() -> list[dict]:
    files = [ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml"]
    files.append(ROOT / "charts" / "kvpilot" / "crd" / "modeldeployments.kvpilot.dev.yaml")
    versions = [yaml.safe_load(f.read_text())["spec"]["versions"][0] for f in files]
    schemas = [v["schema"]["openAPIV3Schema"] for v in versions] + [crd.schema()]
    engines = [s["properties"]["spec"]["properties"]["engine"]["properties"] for s in schemas]
    return [e["speculativeDecoding"]["properties"] for e in engines]


def test_the_crd_and_the_engine_default_to_the_shared_settings():
    engine = EngineConfig()
    assert engine.speculative == speculative.DEFAULT_METHOD
    for schema in _schemas():
        assert schema["method"]["enum"] == list(speculative.METHODS.values())
        assert schema["method"]["default"] == speculative.METHODS[speculative.DEFAULT_METHOD]
        for field, (default, attribute) in FIELDS.items():
            assert schema[field]["default"] == default == getattr(engine, attribute), field


def _server(speculative_decoding: dict) -> argparse.Namespace:
    sample = yaml.safe_load((ROOT / "crds" / "samples" / "builtin-cpu.yaml").read_text())
    sample["spec"].setdefault("engine", {})["speculativeDecoding"] = speculative_decoding
    args = engine_args(Spec.from_defaulted(crd.with_defaults(sample)), "m")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    namespace, _ = parser.parse_known_args(args)
    engine_config(namespace)  # raises ConfigError for a value the engine refuses
    return namespace


def test_a_model_deployments_settings_reach_the_engine():
    assert _server({}).speculative == "none"
    server = _server({"method": "Ngram", "numSpeculativeTokens": 5, "promptLookupMin": 3})
    assert server.speculative == "ngram"
    assert (server.num_speculative_tokens, server.prompt_lookup_min) == (5, 3)
    assert server.prompt_lookup_max == speculative.DEFAULT_LOOKUP_MAX
    assert server.speculative_disable_by_batch_size == speculative.DEFAULT_DISABLE_BY_BATCH_SIZE
