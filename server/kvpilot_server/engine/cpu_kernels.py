"""Optional compiled CPU kernels, built once on first use with the machine's C++ compiler.

The PyTorch reference path in attention.py stays the definition of correct; a kernel here is
used only when it builds, and tests compare the two. Set KVPILOT_CPU_KERNELS=0 to turn them off.
"""

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"


def load() -> ModuleType | None:
    """The compiled module, or None when disabled or the build fails (logged once)."""
    if os.environ.get("KVPILOT_CPU_KERNELS", "1") == "0":
        return None
    return _build()


@functools.cache
def _build() -> ModuleType | None:
    try:
        from torch.utils.cpp_extension import load as build

        return build(
            name="kvpilot_paged_decode",
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, unsupported platform: use PyTorch's ops
        log.warning("CPU attention kernel unavailable (%s); using the reference path", exc)
        return None
