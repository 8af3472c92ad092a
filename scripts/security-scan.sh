#!/usr/bin/env bash
# Static security scan with checkov: the Helm chart in its main configurations (defaults;
# watch.scope=All; every option on: monitoring with skipApiCheck, dashboards, NetworkPolicy),
# each with the Deployment the operator renders for crds/samples/builtin-cpu.yaml, and the
# Dockerfile. Exits non-zero on any failed check that .checkov-skips.yaml does not explain (and
# on a skip that no longer matches anything).
#
#   ./scripts/security-scan.sh
#
# checkov gets its own virtual environment (its dependency pins would disturb .venv), created
# once under $CHECKOV_VENV (default: ~/.cache/kvpilot-security-scan/checkov-<version>, outside
# the repo). The rendered manifests and checkov's JSON reports are left in $SCAN_OUT (default:
# the cache dir's last-scan/), replaced at each run. Needs .venv (./scripts/setup.sh) for
# rendering the chart with helm-python-sdk; no network beyond PyPI for the first install.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CHECKOV_VERSION=3.3.30
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot-security-scan
CHECKOV_VENV=${CHECKOV_VENV:-$CACHE/checkov-$CHECKOV_VERSION}
SCAN_OUT=${SCAN_OUT:-$CACHE/last-scan}
SKIPS=$ROOT/.checkov-skips.yaml

if [[ ! -x .venv/bin/python ]]; then
    echo "security-scan: .venv is missing: run ./scripts/setup.sh first" >&2
    exit 2
fi

# checkov, pinned, in its own venv; .installed marks a complete install (a broken one is redone).
if [[ ! -f $CHECKOV_VENV/.installed ]] \
    || [[ $("$CHECKOV_VENV/bin/checkov" --version 2>/dev/null) != "$CHECKOV_VERSION" ]]; then
    echo "security-scan: installing checkov $CHECKOV_VERSION into $CHECKOV_VENV"
    rm -rf "$CHECKOV_VENV"
    "${PYTHON:-python3}" -m venv "$CHECKOV_VENV"
    "$CHECKOV_VENV/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION"
    touch "$CHECKOV_VENV/.installed"
fi

rm -rf "$SCAN_OUT"
mkdir -p "$SCAN_OUT/manifests" "$SCAN_OUT/reports"
.venv/bin/python scripts/render_manifests.py "$SCAN_OUT/manifests"

# --skip-download: no calls to the Prisma Cloud platform (no API key; guidelines only).
# --soft-fail: findings are judged by checkov_gate.py; checkov's own errors still stop the scan.
checkov() {
    "$CHECKOV_VENV/bin/checkov" --skip-download --soft-fail --quiet --compact -o json "$@"
}
reports=()
for dir in "$SCAN_OUT"/manifests/*/; do
    scan=$(basename "$dir")
    echo "security-scan: checkov kubernetes on $dir"
    # From inside: checkov ignores a directory below a hidden one (such as ~/.cache) given by path.
    (cd "$dir" && checkov --framework kubernetes -d .) >"$SCAN_OUT/reports/$scan.json"
    reports+=("$scan=$SCAN_OUT/reports/$scan.json")
done
echo "security-scan: checkov dockerfile on Dockerfile"
checkov --framework dockerfile -f Dockerfile >"$SCAN_OUT/reports/dockerfile.json"
reports+=("dockerfile=$SCAN_OUT/reports/dockerfile.json")

.venv/bin/python scripts/checkov_gate.py --skips "$SKIPS" "${reports[@]}"
echo "security-scan: passed (reports in $SCAN_OUT/reports)"
