"""The CPU kernels built for an instruction-set level a test names (cpu_kernels.LEVELS), with the
compiler's work kept between runs.

The build directory lives under $KVPILOT_CACHE (default ~/.cache/kvpilot), one per torch and
Python build and per checkout, and torch's ninja build compiles again whatever changed there: a
source, a header (ninja reads the compiler's dependency files), the flags or torch's own paths.
So a test gets the module these sources compile to, as a fresh build would, without compiling it
every run.
"""

import fcntl
import hashlib
import os
import sys
from pathlib import Path

from kvpilot_server.engine.kernels import cpu_kernels


def prebuilt_root(level: cpu_kernels.Level) -> Path:
    """A folder laid out as an image's KVPILOT_CPU_KERNELS_DIR with `level` alone in it."""
    import torch

    cache = Path(os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot")
    # One per torch, interpreter and checkout: the compile commands name the sources' and
    # torch's folders, so two checkouts (a worktree beside /work/main, sharing its virtual
    # environment and this cache) sharing one folder rewrote each other's build.ninja, and each
    # run after the other's compiled all nine objects again (27 s of a 28 s test).
    where = f"{cpu_kernels.CSRC.resolve()}\0{Path(torch.__file__).resolve()}"
    checkout = hashlib.sha256(where.encode()).hexdigest()[:12]
    tag = f"{torch.__version__}-{sys.implementation.cache_tag}-{checkout}-{level.name}"
    return cache / "test-kernels" / tag


def build_prebuilt(level: cpu_kernels.Level) -> Path:
    """Build (or bring up to date) the module for `level` in prebuilt_root(level)/<level name>,
    and return that root. torch names a second build of one name in one process NAME_v1, so a
    run before this one may have left a module of the other name beside it: it is removed,
    under the build's own lock, so that only the module just built can be the one loaded."""
    where = prebuilt_root(level) / level.name
    module = cpu_kernels.build(cpu_kernels.NAME, level.march, str(where))
    built = Path(module.__file__ or "")
    with (where / "kvpilot.flock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # the lock cpu_kernels.build holds while it builds
        for other in where.glob(f"{cpu_kernels.NAME}*.so"):
            if other.name != built.name:
                other.unlink()
    return where.parent
