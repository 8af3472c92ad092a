"""The wheelhouse: the wheels scripts/setup.sh downloaded once (torch with its CUDA libraries,
gigabytes, and every other requirement of the images' extras), kept outside the repository so
that the images built here install them instead of downloading them a second time.

setup.sh and this module name the same folder: KVPILOT_WHEELHOUSE, else kvpilot/wheels in
XDG_CACHE_HOME (~/.cache). It survives a fresh PIP_CACHE_DIR, since pip's cache is not where
it lives."""

import os
from pathlib import Path

WHEELHOUSE = Path(
    os.environ.get("KVPILOT_WHEELHOUSE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpilot" / "wheels"
)
# Where the build's RUN steps see it: read-only, and not in the build context (the
# .dockerignore allowlist keeps the context to the package sources).
MOUNT = "/run/kvpilot-wheels"


def build_args(wheelhouse: Path = WHEELHOUSE) -> list[str]:
    """`buildah bud` arguments that install torch from the wheelhouse alone (the Dockerfile's
    TORCH_WHEELS: pip would otherwise take the index's copy of a file the wheelhouse holds too,
    and download it again). None when the wheelhouse holds no torch: then pip downloads it,
    as a plain build does."""
    if not any(wheelhouse.glob("torch-*.whl")):
        return []
    return ["--volume", f"{wheelhouse}:{MOUNT}:ro", "--build-arg", f"TORCH_WHEELS={MOUNT}"]
