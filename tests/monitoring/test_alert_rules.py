"""promtool on the generated alert rules: they load, and tests/monitoring/alerts_test.yaml (each
alert firing on a series made to trip it, quiet on its neighbours) passes."""

import subprocess
from pathlib import Path

from scripts.generators.paths import FILES, ROOT

HERE = Path(__file__).parent


def promtool(binary: str, *args: str) -> str:
    done = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_rules_load(prometheus_binaries):
    out = promtool(prometheus_binaries[1], "check", "rules", str(FILES / "alerts.yaml"))
    assert "SUCCESS" in out


def test_rules_unit_tests(prometheus_binaries):
    out = promtool(prometheus_binaries[1], "test", "rules", str(HERE / "alerts_test.yaml"))
    assert "SUCCESS" in out


def test_every_alert_is_unit_tested_firing_and_quiet():
    import yaml

    from scripts.generators.alerts import alert_groups

    alerts = {r["alert"] for g in alert_groups()["groups"] for r in g["rules"]}
    cases = [
        case
        for test in yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert alerts - fired == set(), "never seen firing"
    assert alerts - quiet == set(), "never seen quiet"
