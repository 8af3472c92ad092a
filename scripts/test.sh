#!/usr/bin/env bash
# The test command: set up (idempotent), lint, then the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
