"""The kvpilot checkout this package sits in: the control plane and helm helpers read its
charts/, crds/ and scripts/. Found by path, so kvpilot-testing works only installed editable
(`pip install -e testing/`, as scripts/setup.sh does)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvpilot"

if not (ROOT / "pyproject.toml").is_file() or not CHART.is_dir():
    raise ImportError(
        f"kvpilot_testing is not inside a kvpilot checkout ({ROOT}): "
        "install it editable, `pip install -e testing/`"
    )
