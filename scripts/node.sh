#!/usr/bin/env bash
# Make the real test node's host tools available (testing/kvpilot_testing/kube/realnode.py):
# Debian's containerd (with ctr), runc, the CNI plugins, buildah (images, no registry) and
# debootstrap (the Debian base of kvpilot's own images), iproute2 and util-linux (ip netns,
# nsenter), iptables (the bridge plugin's and kube-proxy's rules, inside the node's network
# namespace) and gcc's static libc (the test images' binaries). The kubelet, kube-scheduler
# and kube-proxy come from scripts/controlplane.sh.
# Idempotent: does nothing when all are present. Needs root and apt-get the first time.
set -euo pipefail

need=(containerd ctr runc buildah debootstrap ip nsenter iptables gcc)
missing=0
for c in "${need[@]}"; do command -v "$c" >/dev/null || missing=1; done
[ -x /usr/lib/cni/bridge ] || missing=1
[ "$missing" = 0 ] && exit 0
if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
    echo "node.sh: need root and apt-get to install ${need[*]} and the CNI plugins" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins \
    buildah debootstrap iproute2 util-linux iptables libc6-dev gcc >/dev/null
