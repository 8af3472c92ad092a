"""docs/bench.md and the README against the code: every `kvpilot bench` command shown parses,
the example workload validates, the presets table names the presets, every ModelDeployment shown
passes the CRD (schema and CEL rules), every spec.autoscaling field named exists, and every
repository path named exists."""

import re
import shlex
from pathlib import Path

import yaml

from kvpilot_bench.workload import parse, presets
from kvpilot_common.cli import build_parser
from kvpilot_testing.crd_rules import errors

ROOT = Path(__file__).parents[2]
BENCH_MD = ROOT / "docs" / "bench.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _blocks(path: Path) -> list[tuple[str, str]]:
    return FENCE.findall(path.read_text())


def _commands(path: Path) -> list[list[str]]:
    found = []
    for info, body in _blocks(path):
        if info != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if "kvpilot bench" not in line:
                continue
            words = shlex.split(line)
            if words and words[0].endswith("kvpilot") and words[1:2] == ["bench"]:
                found.append(words[1:])
    return found


def test_bench_commands_in_the_docs_parse():
    commands = _commands(BENCH_MD) + _commands(ROOT / "README.md")
    assert len(commands) >= 4
    parser = build_parser()
    for words in commands:
        args = parser.parse_args(words)
        assert args.command == "bench" and args.url.startswith("http")


def test_the_example_workload_validates_and_the_presets_are_named():
    workloads = [
        yaml.safe_load(body)
        for info, body in _blocks(BENCH_MD)
        if info == "yaml" and "classes:" in body
    ]
    assert workloads
    for spec in workloads:
        parse(spec, "docs/bench.md")
    table = BENCH_MD.read_text().split("| preset |")[1].split("\n\n")[0]
    assert sorted(re.findall(r"^\| `(\w+)` \|", table, re.M)) == presets()


def test_model_deployments_in_the_docs_pass_the_crd():
    shown = [
        yaml.safe_load(body)
        for info, body in _blocks(BENCH_MD)
        if info == "yaml" and "kind: ModelDeployment" in body
    ]
    assert shown
    for obj in shown:
        assert errors(obj) == []


def test_autoscaling_fields_named_exist_in_the_crd():
    crd = yaml.safe_load((ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = schema["properties"]["spec"]["properties"]["autoscaling"]["properties"]
    named = set(re.findall(r"spec\.autoscaling\.(\w+)", BENCH_MD.read_text()))
    assert {"targetQueueDepth", "targetLatencyP95Milliseconds"} <= named
    assert named <= set(fields)


def test_repository_paths_named_exist():
    pattern = r"`((?:common|server|operator|gateway|bench|docs|crds|tests)/[\w./-]+)`"
    named = set(re.findall(pattern, BENCH_MD.read_text()))
    assert named and sorted(p for p in named if not (ROOT / p).exists()) == []
