#!/usr/bin/env bash
# The test command: set up (idempotent), build the Kubernetes control plane and node binaries the
# operator and node tests run against (once; cached outside the repo), install the node's
# Debian tools (containerd, runc, CNI plugins, buildah; once), lint and format check, type-check the torch-free packages (the files
# are in pyproject.toml's [tool.mypy]), then the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/controlplane.sh >/dev/null
./scripts/node.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
