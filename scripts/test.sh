#!/usr/bin/env bash
# The test command: set up (idempotent), build the Kubernetes control plane and node binaries the
# operator and end-to-end tests run against (once; cached outside the repo), install the node's
# Debian tools (containerd, runc, CNI plugins, buildah; once), lint and format check, type-check
# the torch-free packages (the files are in pyproject.toml's [tool.mypy]), then the tests in two
# steps, each with its own pytest summary: everything but tests/e2e (in two workers), then
# tests/e2e on a real node (containerd, the kubelet; the images it runs, built from the Dockerfile in a step of
# their own first). Each step's time is printed and kept in test-results/steps.jsonl, and each
# pytest step's per-test times in test-results/ (kvpilot_testing.durations). Extra args go to
# one pytest run instead of the two steps. `--quick` is the developer's inner loop: set-up, lint
# and types, then every test that needs no control plane, no real node and no SmolLM2 (the
# tiers kvpilot_testing.tiers marks); CI runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p test-results
: >test-results/steps.jsonl

step() {  # name, command...: run it, say how long it took, return its status
  local name="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "== $name: $((SECONDS - start)) s"
  printf '{"step": "%s", "seconds": %d, "status": %d}\n' "$name" $((SECONDS - start)) "$status" \
    >>test-results/steps.jsonl
  return "$status"
}

lint() { .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy; }

# Two pytest-xdist workers, each a file at a time (a module's fixtures are set up once) with its
# share of the cores (kvpilot_testing.workers): much of the suite waits on servers, control
# planes and subprocesses, and one worker leaves the second core idle then. tests/e2e runs in
# one process: its tests are the steps of one story on the one real node.
WORKERS=(-n 2 --dist loadfile)

step "set-up" ./scripts/setup.sh
if [ "${1:-}" = "--quick" ]; then
  shift
  step "lint and types" lint
  KVPILOT_DURATIONS=test-results/quick.json step "quick tests (no k8s, e2e or slow)" \
    .venv/bin/python -m pytest --quick "${WORKERS[@]}" "$@"
  exit
fi
step "control plane binaries" bash -c "./scripts/controlplane.sh >/dev/null"
step "node tools" ./scripts/node.sh
step "lint and types" lint
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
failed=0
KVPILOT_DURATIONS=test-results/main.json \
  step "tests (all but tests/e2e)" .venv/bin/python -m pytest --ignore=tests/e2e "${WORKERS[@]}" ||
  failed=1
step "images for the real node" .venv/bin/python -m kvpilot_testing.kube.images || failed=1
KVPILOT_DURATIONS=test-results/e2e.json \
  step "end-to-end tests (tests/e2e, a real node)" .venv/bin/python -m pytest tests/e2e || failed=1
exit "$failed"
