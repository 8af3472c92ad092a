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
_CSRC = Path(__file__).parent / "csrc"


def load() -> ModuleType | None:
    """The paged decode-attention module, or None when disabled or the build fails."""
    if not _enabled():
        return None
    return _build("kvpilot_paged_decode", "paged_decode.cpp")


def load_weight_only() -> ModuleType | None:
    """The int8/int4 (and float32) decode-sized products (AVX2; int4 and the int8 lm_head
    against int8 activations), or None when disabled or the build fails."""
    if not _enabled():
        return None
    return _build("kvpilot_weight_only", "weight_only.cpp", "int8_activations.cpp")


def load_layer_ops() -> ModuleType | None:
    """A decode layer's small ops (norms, rotary embedding), or None when disabled or the build
    fails. Without contracted multiply-adds: the rotation then equals PyTorch's bit for bit."""
    if not _enabled():
        return None
    return _build("kvpilot_layer_ops", "layer_ops.cpp", flags=("-ffp-contract=off",))


def _enabled() -> bool:
    return os.environ.get("KVPILOT_CPU_KERNELS", "1") != "0"


@functools.cache
def _build(name: str, *sources: str, flags: tuple[str, ...] = ()) -> ModuleType | None:
    try:
        from torch.utils.cpp_extension import load as build

        return build(
            name=name,
            sources=[str(_CSRC / source) for source in sources],
            extra_include_paths=[str(_CSRC)],
            extra_cflags=["-O3", "-march=native", "-fopenmp", *flags],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, unsupported platform: use PyTorch's ops
        log.warning("CPU kernel %s unavailable (%s); using the PyTorch path", name, exc)
        return None
