"""Images for the real node (kube/realnode.py), built without a registry or a Docker engine: a
static binary compiled here, put in an image from scratch by buildah (vfs storage, its own
root), written as an OCI archive and imported into the node's containerd. Nothing is pulled.

- the sandbox image, SANDBOX_IMAGE, from Kubernetes' own build/pause/linux/pause.c in the Go
  module cache, at the pinned Kubernetes version, compiled as its Makefile does;
- WORKLOAD_IMAGE, tools/node/workload.c: sleeps until SIGTERM, or holds memory, or exits 0 (an
  exec probe), as uid 1000;
- kvpilot's own images, a target of the Dockerfile each (project_image), built by
  scripts/build-image.sh on a Debian base it makes with debootstrap (no registry is asked), pip
in the build taking its wheels from scripts/setup.sh's wheelhouse (kube/wheelhouse.py).

Archives are cached by a hash of their inputs, so an unchanged image is not rebuilt."""

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from kvpilot_testing.kube.controlplane import BIN_DIR
from kvpilot_testing.kube.realnode import CONFIGS, SANDBOX_IMAGE
from kvpilot_testing.kube.wheelhouse import build_args
from kvpilot_testing.paths import ROOT

CACHE = BIN_DIR.parent / "images"
WORKLOAD_IMAGE = "kvpilot.test/workload:1"


def _run(*argv: str | Path) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed: {done.stderr[-2000:]}")
    return done.stdout


def pause_source() -> Path:
    """pause.c at the Kubernetes version tools/controlplane/go.mod pins (scripts/controlplane.sh
    has downloaded that module)."""
    pin = re.search(r"k8s\.io/kubernetes (v\S+)", (ROOT / "tools/controlplane/go.mod").read_text())
    modules = Path(_run("go", "env", "GOMODCACHE").strip())
    return modules / f"k8s.io/kubernetes@{pin[1]}" / "build/pause/linux/pause.c"


def sandbox_archive() -> Path:
    version = SANDBOX_IMAGE.rpartition(":")[2]
    return static_image(
        SANDBOX_IMAGE, pause_source(), ["/pause"], user="65535:65535", defines=[f"v{version}"]
    )


def workload_archive() -> Path:
    return static_image(WORKLOAD_IMAGE, CONFIGS / "workload.c", ["/workload"], user="1000:1000")


# What the Dockerfile's COPY lines read, and how it is built: an image's inputs.
BUILD_INPUTS = (
    "Dockerfile",
    "scripts/build-image.sh",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "crds",
    "common",
    "operator",
    "server",
    "gateway",
    "bench",
)
_SUFFIXES = {"server": "", "server-cpu": "-cpu", "operator": "-operator"}
# overlay, not build-image.sh's default vfs: vfs copies the whole file system at every layer,
# and server-cpu's torch makes that gigabytes a step. This machine's kernel has overlayfs (the
# node's containerd snapshots with it too).
STORAGE_DRIVER = "overlay"


def project_archive(target: str) -> tuple[str, Path]:
    """(the image's name as scripts/build-image.sh tags it, where its archive is cached): the
    archive's name carries a hash of BUILD_INPUTS."""
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    name = f"localhost/kvpilot:{version[1]}{_SUFFIXES[target]}"
    files = _run("git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "--", *BUILD_INPUTS)
    digest = hashlib.sha256(name.encode())
    for relative in sorted(files.split()):
        path = ROOT / relative
        if path.is_file():
            digest.update(relative.encode() + b"\0" + path.read_bytes())
    return name, CACHE / f"kvpilot-{target}-{digest.hexdigest()[:16]}.tar"


def project_image(target: str) -> tuple[str, Path]:
    """(the image's name, an OCI archive of it) for a target of the Dockerfile; built again
    only when one of BUILD_INPUTS changed."""
    name, archive = project_archive(target)
    if archive.is_file():
        return name, archive
    CACHE.mkdir(parents=True, exist_ok=True)
    # --layers: buildah keeps each step's result and reuses it while the step and what came
    # before are unchanged, so a change to the sources does not install torch again.
    build = subprocess.run(
        [ROOT / "scripts/build-image.sh", target, "--layers", *build_args()],
        env={**os.environ, "LOCAL_BASE": "always", "IMAGE": name, "STORAGE_DRIVER": STORAGE_DRIVER},
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode:
        raise RuntimeError(f"scripts/build-image.sh {target} failed: {build.stderr[-3000:]}")
    partial = archive.with_suffix(".partial")
    # Uncompressed: gzip of a server image costs minutes on two cores, and the archive is only
    # read back by ctr on this machine.
    buildah = ["buildah", "--storage-driver", STORAGE_DRIVER, "push", "--disable-compression"]
    _run(*buildah, name, f"oci-archive:{partial}:{name}")
    for stale in CACHE.glob(f"kvpilot-{target}-*.tar"):
        stale.unlink()  # an earlier tree's: each is the size of the image
    partial.replace(archive)
    return name, archive


def chart_values(key: str, name: str) -> list[str]:
    """`helm --set` values for an image the chart names under `key` (image, modelImage)."""
    registry, _, rest = name.partition("/")
    repository, _, tag = rest.partition(":")
    values = {"registry": registry, "repository": repository, "tag": tag}
    return [a for field, value in values.items() for a in ("--set", f"{key}.{field}={value}")]


def static_image(
    name: str, source: Path, entrypoint: list[str], user: str, defines: list[str] = ()
) -> Path:
    """An OCI archive of an image holding only `source` compiled statically, at
    entrypoint[0]; built once per distinct input."""
    config = json.dumps([name, entrypoint, user, list(defines)])
    key = hashlib.sha256(source.read_bytes() + config.encode()).hexdigest()[:16]
    archive = CACHE / f"{re.sub(r'[^a-z0-9]+', '-', name)}-{key}.tar"
    if archive.is_file():
        return archive
    work = CACHE / f"build-{key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    binary = work / Path(entrypoint[0]).name
    flags = [f"-DVERSION={d}" for d in defines]
    _run("gcc", "-Os", "-Wall", "-Werror", "-static", *flags, "-o", binary, source)
    buildah = [
        "buildah",
        "--root",
        CACHE / "buildah-storage",
        "--runroot",
        work / "run",
        "--storage-driver",
        "vfs",
    ]
    container = _run(*buildah, "from", "scratch").strip()
    try:
        _run(*buildah, "copy", "--chmod", "0755", container, binary, entrypoint[0])
        _run(*buildah, "config", "--entrypoint", json.dumps(entrypoint), "--user", user, container)
        _run(*buildah, "commit", "--rm", container, f"oci-archive:{work / 'image.tar'}:{name}")
    except RuntimeError:
        _run(*buildah, "rm", container)
        raise
    (work / "image.tar").replace(archive)
    shutil.rmtree(work, ignore_errors=True)
    return archive


def node_images() -> list[Path]:
    """What every test node holds: the sandbox image and the workload."""
    return [sandbox_archive(), workload_archive()]


def build_all() -> None:
    """Every image tests/e2e imports, built now (or found cached), with the time each took:
    scripts/test.sh runs this as its own step, outside pytest's per-test timeout."""
    import time

    for what, build in (
        ("sandbox and workload", node_images),
        ("operator", lambda: project_image("operator")),
        ("server-cpu", lambda: project_image("server-cpu")),
    ):
        start = time.monotonic()
        build()
        print(f"image {what}: {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    build_all()
