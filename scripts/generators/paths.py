"""Where the generators read and write (relative to the repository root unless absolute), and
the command that runs them, which the generated files name."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = Path("charts/kvpilot")
FILES = CHART / "files"  # the dashboards and alert rules the chart wraps
COMMAND = ".venv/bin/python scripts/generate.py"
