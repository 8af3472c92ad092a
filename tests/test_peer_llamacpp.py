"""benchmarks/peer_llamacpp.py without llama.cpp: its build takes 15-30 minutes, so CI never
runs the benchmark itself, only checks that the script starts without it."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_llamacpp.py"


def test_help_works_without_llama_cpp():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--skip-llamacpp" in done.stdout and "nice -n 19" in done.stdout


def test_module_level_imports_are_stdlib_only():
    # The llama.cpp worker runs this file in a venv that has neither torch nor kvpilot.
    probe = (
        f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import peer_llamacpp; "
        "print(sorted(m for m in ('torch', 'kvpilot_server', 'llama_cpp') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
