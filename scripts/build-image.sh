#!/usr/bin/env bash
# Build one target of the top-level Dockerfile with buildah: server (CUDA), server-cpu, operator.
#
#   scripts/build-image.sh TARGET [extra buildah bud arguments...]
#
# The base images are build arguments (PYTHON_BASE, CUDA_BASE). Where they can be pulled (or are
# already in local storage) they are used as they are. Where no registry is reachable, a Debian
# base with Python is made once with debootstrap from the Debian mirror, cached as a tarball and
# as a local image, and passed as the base argument instead. Running it again reuses both and
# rebuilds the target; pip downloads are kept in a buildah cache mount between builds.
#
# Environment (all optional):
#   IMAGE            tag to give the result   (default localhost/kvpilot:VERSION, with -cpu or
#                    -operator appended for those targets)
#   PYTHON_BASE      slim Python base for server-cpu and operator
#   CUDA_BASE        CUDA runtime base for server
#   LOCAL_BASE       auto (default: debootstrap only when the base cannot be pulled), always, never
#   STORAGE_DRIVER   buildah storage driver (default: vfs, which works inside containers and VMs
#                    without overlay support; set overlay on a normal host)
#   BUILDAH_ISOLATION  default chroot (no user namespaces or rlimit changes needed)
#   DEBIAN_SUITE, DEBIAN_MIRROR   for the local base (default bookworm, debootstrap's mirror)
#   CACHE_DIR        where the local base tarball is kept (default ~/.cache/kvpilot/image)
#   PULL_TIMEOUT     seconds to wait for a base image pull before falling back (default 120)
#   CA_BUNDLE        CA certificates pip in the build should trust (default: $PIP_CERT, if set)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST   passed on to pip in the build
#   TORCH_INDEX_URL  where torch alone comes from (a CPU-only index makes server-cpu far smaller)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'build-image: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

TARGET=${1:-}
[ $# -gt 0 ] && shift
case "$TARGET" in
  server | server-cpu | operator) ;;
  *) die "usage: $0 server|server-cpu|operator [buildah bud args...]" ;;
esac

command -v buildah >/dev/null || die "buildah is not installed (Debian: apt-get install buildah)"

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
[ -n "$VERSION" ] || die "no version found in pyproject.toml"
case "$TARGET" in
  server) suffix="" ;;
  server-cpu) suffix="-cpu" ;;
  operator) suffix="-operator" ;;
esac
IMAGE=${IMAGE:-localhost/kvpilot:$VERSION$suffix}
LOCAL_BASE=${LOCAL_BASE:-auto}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-}
CACHE_DIR=${CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot/image}
PULL_TIMEOUT=${PULL_TIMEOUT:-120}
CA_BUNDLE=${CA_BUNDLE:-${PIP_CERT:-}}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
BUILDAH=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")

# The default for each base argument lives in the Dockerfile; read it so there is one source.
dockerfile_default() {
  sed -n "s/^ARG $1=\(.*\)$/\1/p" Dockerfile | head -n1
}
case "$TARGET" in
  server) BASE_ARG=CUDA_BASE ;;
  *) BASE_ARG=PYTHON_BASE ;;
esac
BASE=${!BASE_ARG:-$(dockerfile_default "$BASE_ARG")}
[ -n "$BASE" ] || die "no default for $BASE_ARG in the Dockerfile"

have_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# A Debian root file system with Python, venv and CA certificates: what the Dockerfile expects of
# a slim Python base. Made once; the tarball survives a wipe of the container storage.
local_base() {
  local name="localhost/kvpilot-base:debian-$DEBIAN_SUITE"
  local tarball="$CACHE_DIR/debian-$DEBIAN_SUITE.tar"
  if have_image "$name"; then
    say "local base $name is already in storage; reusing it"
    LOCAL_BASE_IMAGE=$name
    return
  fi
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null ||
      die "debootstrap is not installed (Debian: apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    mkdir -p "$CACHE_DIR"
    local rootfs
    rootfs=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    chmod 0755 "$rootfs" # it becomes the image's /, which mktemp would leave at 0700
    say "making a Debian $DEBIAN_SUITE base with debootstrap${DEBIAN_MIRROR:+ from $DEBIAN_MIRROR} (minutes, once)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$DEBIAN_SUITE" "$rootfs" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$CACHE_DIR/debootstrap.log" 2>&1 ||
      { rm -rf "$rootfs"; die "debootstrap failed; see $CACHE_DIR/debootstrap.log"; }
    # Leave out what only bloats an image: package lists and downloaded .debs.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$rootfs" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
    say "cached the base file system as $tarball"
  else
    say "using the cached base file system $tarball"
  fi
  say "importing it as $name"
  local ctr
  ctr=$("${BUILDAH[@]}" from --quiet scratch)
  "${BUILDAH[@]}" add --quiet "$ctr" "$tarball" / >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash \
    --label "org.opencontainers.image.description=Debian $DEBIAN_SUITE (debootstrap) with Python" \
    "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
  LOCAL_BASE_IMAGE=$name
}

use_local=no
case "$LOCAL_BASE" in
  always) use_local=yes ;;
  never) ;;
  auto)
    if have_image "$BASE"; then
      say "base $BASE is in local storage"
    else
      say "pulling base $BASE (up to ${PULL_TIMEOUT}s)"
      if ! timeout "$PULL_TIMEOUT" "${BUILDAH[@]}" pull --quiet "$BASE" >/dev/null 2>&1; then
        say "cannot pull $BASE (no registry reachable?); falling back to a local Debian base"
        use_local=yes
      fi
    fi
    ;;
  *) die "LOCAL_BASE must be auto, always or never, not $LOCAL_BASE" ;;
esac

ARGS=(--build-arg "VERSION=$VERSION")
if [ "$use_local" = yes ]; then
  local_base
  ARGS+=(--build-arg "$BASE_ARG=$LOCAL_BASE_IMAGE")
  [ "$TARGET" = server ] &&
    say "note: server on a plain Debian base relies on the CUDA libraries in the torch wheels"
  BASE=$LOCAL_BASE_IMAGE
else
  ARGS+=(--build-arg "$BASE_ARG=$BASE")
fi
if git rev-parse --git-dir >/dev/null 2>&1; then
  revision=$(git rev-parse HEAD)
  git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
  ARGS+=(--build-arg "REVISION=$revision")
fi
ARGS+=(--build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
# The build trusts what this machine's pip trusts (an intercepting proxy's CA, say): the bundle
# is mounted read-only into the RUN steps and named by PIP_CERT, a build-stage-only argument, so
# it never lands in an image.
if [ -n "$CA_BUNDLE" ]; then
  [ -r "$CA_BUNDLE" ] || die "CA_BUNDLE $CA_BUNDLE is not readable"
  say "pip in the build trusts $CA_BUNDLE"
  ARGS+=(--volume "$CA_BUNDLE:/run/kvpilot-build-ca.crt:ro")
  ARGS+=(--build-arg PIP_CERT=/run/kvpilot-build-ca.crt)
fi
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST TORCH_INDEX_URL; do
  if [ -n "${!name:-}" ]; then
    say "passing $name=${!name}"
    ARGS+=(--build-arg "$name=${!name}")
  fi
done

say "building target $TARGET from $BASE as $IMAGE (isolation $BUILDAH_ISOLATION)"
"${BUILDAH[@]}" bud --target "$TARGET" --tag "$IMAGE" "${ARGS[@]}" "$@" -f Dockerfile .
# Building again under the same tag leaves the previous image untagged: remove those.
"${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE" 2>/dev/null | head -n1 || true)
say "built $IMAGE${size:+ ($size)}"
