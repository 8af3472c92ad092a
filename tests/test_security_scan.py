"""scripts/security-scan.sh's parts that need no checkov: the manifests it scans, the committed
skip file, and the gate that judges checkov's reports against it (unexplained failures, stale
skips, scans limited by name, reports that scanned nothing)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
SKIPS = ROOT / ".checkov-skips.yaml"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gate = _script("checkov_gate")


def _report(*failures: tuple[str, str], resources: int = 3) -> dict:
    failed = [
        {
            "check_id": check,
            "check_name": f"the {check} check",
            "resource": resource,
            "file_path": "/chart.yaml",
            "file_line_range": [1, 9],
            "severity": None,
        }
        for check, resource in failures
    ]
    summary = {"passed": 5, "failed": len(failed), "parsing_errors": 0}
    return {
        "check_type": "kubernetes",
        "results": {"failed_checks": failed},
        "summary": {**summary, "resource_count": resources},
    }


def _skip(check: str, *resources: str, scans=gate.SCANS) -> gate.Skip:
    return gate.Skip(check, list(resources), "because", list(scans))


def test_the_committed_skip_file_is_well_formed_and_every_skip_says_why():
    skips = gate.load_skips(SKIPS)
    assert skips
    for skip in skips:
        assert skip.why and "\n" not in skip.why
    # The scans the gate knows are the chart configurations rendered, plus the Dockerfile.
    assert set(gate.SCANS) == {*_script("render_manifests").CONFIGURATIONS, "dockerfile"}


@pytest.mark.parametrize(
    "entry",
    [
        {"check": "CKV_K8S_43", "resources": ["Deployment.*"]},  # no why
        {"check": "CKV_K8S_43", "resources": ["Deployment.*"], "why": "two\nlines"},
        {"check": "CKV_K8S_43", "resources": [], "why": "no resources"},
        {"check": "K8S_43", "resources": ["x"], "why": "not a check id"},
        {"check": "CKV_K8S_43", "resources": ["x"], "why": "w", "scans": ["production"]},
        {"check": "CKV_K8S_43", "resources": ["x"], "why": "w", "reason": "a typo"},
    ],
)
def test_malformed_skips_are_refused(tmp_path, entry):
    path = tmp_path / "skips.yaml"
    path.write_text(yaml.safe_dump({"skips": [entry]}))
    with pytest.raises(ValueError, match="skip 1"):
        gate.load_skips(path)


def test_only_explained_failures_pass():
    report = _report(("CKV_K8S_43", "Deployment.ns.op"), ("CKV_K8S_11", "Deployment.ns.op"))
    lines, problems = gate.judge({"defaults": [report]}, [_skip("CKV_K8S_43", "Deployment.*")])
    assert problems == 1
    text = "\n".join(lines)
    assert "skipped: because" in text and "UNEXPLAINED: the CKV_K8S_11 check" in text
    assert lines[-1].startswith("checkov: 5 passed, 2 failed (1 explained, 1 unexplained")


def test_a_skip_covers_only_its_resources_and_scans():
    pod = ("CKV2_K8S_6", "Pod.ns.op.app-x")
    skip = _skip("CKV2_K8S_6", "Pod.ns.op.*", scans=["defaults"])
    assert gate.judge({"defaults": [_report(pod)]}, [skip])[1] == 0
    assert gate.judge({"defaults": [_report(pod)], "all-on": [_report(pod)]}, [skip])[1] == 1
    other = _skip("CKV2_K8S_6", "Pod.ns.model.*")
    assert gate.judge({"defaults": [_report(pod)]}, [skip, other])[1] == 1  # other is stale


def test_stale_skips_and_empty_scans_fail():
    lines, problems = gate.judge({"defaults": [_report()]}, [_skip("CKV_K8S_43", "x")])
    assert problems == 1 and "STALE skip CKV_K8S_43" in lines[0]
    lines, problems = gate.judge({"defaults": [_report(resources=0)]}, [])
    assert problems == 1 and "scanned nothing" in lines[0]


def test_the_gate_reads_one_report_or_a_list_of_them(tmp_path):
    single, several = tmp_path / "one.json", tmp_path / "list.json"
    report = _report(("CKV_K8S_43", "Deployment.ns.op"))
    single.write_text(json.dumps(report))
    several.write_text(json.dumps([report, report]))
    skips = tmp_path / "skips.yaml"
    skip = {"check": "CKV_K8S_43", "resources": ["Deployment.ns.*"], "why": "w"}
    skips.write_text(yaml.safe_dump({"skips": [skip]}))
    command = [sys.executable, ROOT / "scripts" / "checkov_gate.py", "--skips", skips]
    ok = subprocess.run([*command, f"defaults={single}", f"all-on={several}"], check=False)
    assert ok.returncode == 0
    skips.write_text("skips: []\n")
    failed = subprocess.run([*command, f"defaults={single}"], capture_output=True, check=False)
    assert failed.returncode == 1 and b"1 problem(s)" in failed.stderr


def test_the_scanned_manifests_cover_the_configurations_and_the_model_pod(tmp_path):
    subprocess.run([sys.executable, ROOT / "scripts" / "render_manifests.py", tmp_path], check=True)
    kinds = {}
    for configuration in ("defaults", "watch-all", "all-on"):
        for name in ("chart", "model-builtin-cpu"):
            text = (tmp_path / configuration / f"{name}.yaml").read_text()
            kinds[configuration, name] = {o["kind"] for o in yaml.safe_load_all(text)}
    assert "ClusterRole" in kinds["watch-all", "chart"]
    assert {"NetworkPolicy", "ServiceMonitor", "PodMonitor"} <= kinds["all-on", "chart"]
    assert "Deployment" in kinds["defaults", "model-builtin-cpu"]
