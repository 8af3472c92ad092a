#!/usr/bin/env bash
# Line coverage of the main step (the suite but tests/e2e, as scripts/test.sh runs it: two
# xdist workers), every Python process it starts included ([tool.coverage.run] in pyproject.toml).
# A change that makes the suite cheaper shows with it that nothing it tested went untested: run
# this before and after and compare the per-package lines. Prints one line per package and
# writes test-results/coverage.json (coverage's own per-file report) and coverage-packages.txt.
# Extra args go to pytest. A failing test does not stop the report; the exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/controlplane.sh >/dev/null
./scripts/node.sh
mkdir -p test-results
rm -f test-results/.coverage test-results/.coverage.*
export COVERAGE_FILE=$PWD/test-results/.coverage  # absolute: servers run in other folders
status=0
KVPILOT_DURATIONS=test-results/coverage-durations.json .venv/bin/python -m coverage run \
  -m pytest --ignore=tests/e2e -n 2 --dist loadfile "$@" || status=$?
.venv/bin/python -m coverage combine --quiet
.venv/bin/python -m coverage json --quiet -o test-results/coverage.json
for package in kvpilot_common kvpilot_server kvpilot_operator kvpilot_gateway kvpilot_bench; do
  echo "$package $(.venv/bin/python -m coverage report --include="*/$package/*" --format=total)%"
done | tee test-results/coverage-packages.txt
exit "$status"
