#!/usr/bin/env bash
# Make `prometheus` and `promtool` available for tests/monitoring: Debian's `prometheus` package
# carries both. Idempotent: does nothing when both are already on PATH. Needs root (or sudo) and
# apt-get the first time; prints why and exits non-zero when it cannot install them.
#
# The package's postinst enables a `prometheus` service; where systemd runs (not in containers
# or CI) it starts listening on :9090. The tests never use it: they start their own server on a
# free 127.0.0.1 port.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-prometheus.sh: no apt-get here; install Prometheus (server and promtool) by hand" >&2
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "install-prometheus.sh: need root to run apt-get install prometheus" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
