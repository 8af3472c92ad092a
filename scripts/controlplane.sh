#!/usr/bin/env bash
# Builds a real Kubernetes control plane from Go modules at pinned versions, for tests that
# need an API server: kube-apiserver and kube-controller-manager, and for the real node
# (testing/kvpilot_testing/kube/realnode.py) kubelet, kube-scheduler, kube-proxy and kubectl
# (all k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3) and helm (helm.sh/helm/v3).
# The pins live in tools/controlplane/{go.mod,etcd/go.mod,helm/go.mod} with their go.sum;
# the binaries go to a cache outside the repo:
#   ${KVPILOT_TOOLS_CACHE:-$HOME/.cache/kvpilot/controlplane}/bin
# Idempotent: a component whose stamp (its go.mod, go.sum, the Go version and the build
# flags) matches and whose binaries exist is skipped. Needs Go >= 1.26 (etcd v3.6.16 declares
# go 1.26.0) and the Go module proxy (or a warm module cache). Timings, and the start-up flags
# that work: tools/controlplane/README.md.
#
#   scripts/controlplane.sh                  build what is missing, print the bin directory
#   scripts/controlplane.sh etcd helm        only these (kubernetes, etcd, helm)
#   scripts/controlplane.sh --force ...      rebuild even when stamped
#   scripts/controlplane.sh --bin-dir        print the bin directory, build nothing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/tools/controlplane"
CACHE="${KVPILOT_TOOLS_CACHE:-$HOME/.cache/kvpilot/controlplane}"
BIN="$CACHE/bin"
STAMPS="$CACHE/stamps"

# Keep these in step with the go.mod files (the stamp hashes those, these set the
# version strings the binaries report).
KUBERNETES_VERSION=v1.35.4
HELM_VERSION=v3.20.2

force=0
wanted=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --bin-dir) echo "$BIN"; exit 0 ;;
    kubernetes | etcd | helm) wanted+=("$arg") ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "controlplane.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[ ${#wanted[@]} -gt 0 ] || wanted=(kubernetes etcd helm)

command -v go >/dev/null || { echo "controlplane.sh: needs Go (>= 1.26) on PATH" >&2; exit 1; }
mkdir -p "$BIN" "$STAMPS"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED="${CGO_ENABLED:-0}"

stamp_of() {  # the module directory's pins, the toolchain and the build arguments
  local dir="$1"; shift
  (cat "$dir/go.mod" "$dir/go.sum"; go env GOVERSION GOOS GOARCH CGO_ENABLED; echo "$@") |
    sha256sum | cut -d' ' -f1
}

build() {  # name, module dir, binaries..., then -- go build arguments
  local name="$1" dir="$2"; shift 2
  local bins=()
  while [ "$1" != "--" ]; do bins+=("$1"); shift; done
  shift
  local stamp; stamp="$(stamp_of "$dir" "$@")"
  local have=1 b
  for b in "${bins[@]}"; do [ -x "$BIN/$b" ] || have=0; done
  if [ "$force" = 0 ] && [ "$have" = 1 ] && [ "$(cat "$STAMPS/$name" 2>/dev/null)" = "$stamp" ]; then
    echo "controlplane.sh: $name is up to date (${bins[*]})" >&2
    return
  fi
  echo "controlplane.sh: building $name (${bins[*]})..." >&2
  local start=$SECONDS
  (cd "$dir" && go build -trimpath "$@")
  echo "$stamp" >"$STAMPS/$name"
  echo "controlplane.sh: built $name in $((SECONDS - start))s" >&2
}

for name in "${wanted[@]}"; do
  case "$name" in
    kubernetes)
      minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
      ldflags="-s -w"
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean"
      done
      commands=(kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy kubectl)
      build kubernetes "$TOOLS" "${commands[@]}" -- \
        -ldflags "$ldflags" -o "$BIN/" "${commands[@]/#/k8s.io/kubernetes/cmd/}"
      ;;
    etcd)
      build etcd "$TOOLS/etcd" etcd -- -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
      ;;
    helm)
      # As helm's Makefile: the default Kubernetes version (helm template, lint) is that of
      # its client-go, v0.X.Y -> v1.X (otherwise v1.20, below the chart's kubeVersion).
      kube="$(cd "$TOOLS/helm" && go list -f '{{.Version}}' -m k8s.io/client-go)"
      kminor="${kube#v0.}"; kminor="${kminor%%.*}"
      ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
      for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
      done
      build helm "$TOOLS/helm" helm -- -ldflags "$ldflags" \
        -o "$BIN/helm" helm.sh/helm/v3/cmd/helm
      ;;
  esac
done
echo "$BIN"
