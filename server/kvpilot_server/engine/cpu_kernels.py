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
    """Compile the module under `name`, with extra compiler flags (tests build variants)."""
    from torch.utils.cpp_extension import load as compile_module

    return compile_module(
        name=name,
        sources=[str(CSRC / source) for source in SOURCES],
        extra_include_paths=[str(CSRC)],
        extra_cflags=[*FLAGS, *flags],
        extra_ldflags=["-fopenmp"],
        build_directory=directory,
        verbose=False,
    )
