"""Optional compiled CPU kernels (csrc/), built once on first use with the machine's C++
compiler into one module.

The PyTorch reference path stays the definition of correct; a kernel is used only when the
module builds, and tests compare the two. Set KVPILOT_CPU_KERNELS=0 to turn them off.
"""

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "module.cpp",
    "weight_only.cpp",
    "int8_activations.cpp",
    "layer_ops.cpp",
    "paged_decode.cpp",
    "decode_stack.cpp",
)
# Without contracted multiply-adds the rotation is the same float operations as PyTorch's, bit
# for bit; the products' multiply-adds are explicit intrinsics, so they keep theirs.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")


def load() -> ModuleType | None:
    """The kernels' module, or None when disabled or the build fails."""
    if os.environ.get("KVPILOT_CPU_KERNELS", "1") == "0":
        return None
    return _load()


@functools.cache
def _load() -> ModuleType | None:
    try:
        return build("kvpilot_cpu")
    except Exception as exc:  # no compiler, no ninja, unsupported platform: use PyTorch's ops
        log.warning("CPU kernels unavailable (%s); using the PyTorch path", exc)
        return None


def build(name: str, flags: tuple[str, ...] = (), directory: str | None = None) -> ModuleType:
    """Compile the module under `name`, with extra compiler flags (tests build variants).

    torch marks a build in progress with a plain `lock` file that a killed build (a server
    stopped during its first start) leaves behind, and every later load then waits for it
    forever, silently. An flock, which the kernel drops with its process, says whether a build
    really runs: whoever holds it may remove a leftover mark."""
    import fcntl

    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as compile_module

    where = Path(directory or _get_build_directory(name, verbose=False))
    where.mkdir(parents=True, exist_ok=True)
    with (where / "kvpilot.flock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the process dies, however
        (where / "lock").unlink(missing_ok=True)
        return compile_module(
            name=name,
            sources=[str(CSRC / source) for source in SOURCES],
            extra_include_paths=[str(CSRC)],
            extra_cflags=[*FLAGS, *flags],
            extra_ldflags=["-fopenmp"],
            build_directory=str(where),
            verbose=False,
        )
