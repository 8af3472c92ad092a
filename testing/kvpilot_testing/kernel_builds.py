"""The CPU kernels built for an instruction-set level a test names (cpu_kernels.LEVELS), with the
compiler's work kept between runs.

The build directory lives under $KVPILOT_CACHE (default ~/.cache/kvpilot), named by what the
build depends on (cpu_kernels.source_key: the sources, flags, torch, the interpreter), so every
checkout of the same sources (a clean clone in CI, a worktree) gets the module these sources
compile to, as a fresh build would, compiled once.
"""

import fcntl
import os
from pathlib import Path

from kvpilot_server.engine.kernels import cpu_kernels


def prebuilt_root(level: cpu_kernels.Level) -> Path:
    """A folder laid out as an image's KVPILOT_CPU_KERNELS_DIR with `level` alone in it."""
    cache = Path(os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot")
    return cache / "test-kernels" / f"{level.name}-{cpu_kernels.source_key(level.march)}"


def build_prebuilt(level: cpu_kernels.Level) -> Path:
    """Build the module for `level` in prebuilt_root(level)/<level name> (once: build_once),
    and return that root. torch names a second build of one name in one process NAME_v1, so a
    run before this one may have left a module of the other name beside it: it is removed,
    under the build's own lock, so that only the module just built can be the one loaded."""
    where = prebuilt_root(level) / level.name
    # Its own name (the prebuilt lookup takes any kvpilot_cpu*.so): the test loads it beside
    # this CPU's build, and a second library of one soname would be the first one again.
    module = cpu_kernels.build_once(f"{cpu_kernels.NAME}_{level.name}", level.march, where)
    built = Path(module.__file__ or "")
    with (where / "kvpilot.flock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # the lock cpu_kernels.build holds while it builds
        for other in where.glob(f"{cpu_kernels.NAME}*.so"):
            if other.name != built.name:
                other.unlink()
    return where.parent
