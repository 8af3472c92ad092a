"""Optional compiled CPU kernels (csrc/), one module, found prebuilt or built on first use.

A server image carries the module prebuilt for a few instruction-set levels (`prebuild`, run by
the Dockerfile into KVPILOT_CPU_KERNELS_DIR): a new pod then serves within seconds instead of
compiling first, and without the compiler's gigabytes on top of the model's inside its memory
limit. The best level the CPU's flags allow is imported; a CPU that fits none (or a
checkout without the directory) builds the module once with the machine's C++ compiler and
-march=native, as before.

The PyTorch reference path stays the definition of correct; a kernel is used only when the
module loads, and tests compare the two. Set KVPILOT_CPU_KERNELS=0 to turn them off.
"""

import functools
import hashlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)
CSRC = Path(__file__).parent / "csrc"
NAME = "kvpilot_cpu"
SOURCES = (
    "module.cpp",
    "weight_only.cpp",
    "float32_gemm.cpp",
    "int8_activations.cpp",
    "layer_ops.cpp",
    "paged_decode.cpp",
    "paged_prefill.cpp",
    "kv_write.cpp",
    "decode_stack.cpp",
)
# Without contracted multiply-adds the rotation is the same float operations as PyTorch's, bit
# for bit; the products' multiply-adds are explicit intrinsics, so they keep theirs.
FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
PREBUILT_ENV = "KVPILOT_CPU_KERNELS_DIR"


@dataclass(frozen=True)
class Level:
    """One prebuilt instruction-set level: its compiler flags and the /proc/cpuinfo flags a CPU
    must show to run it."""

    name: str
    march: tuple[str, ...]
    needs: frozenset[str]


# x86-64-v3 is the floor the kernels' intrinsics need (AVX2, FMA, F16C); v4 adds AVX-512, and
# VNNI turns on the int8 activations' dot-product path. Best first.
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
LEVELS = (
    Level("avx512-vnni", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}),
    Level("avx2", ("-march=x86-64-v3",), _V3),
)


def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def choose(flags: frozenset[str], available: set[str]) -> Level | None:
    """The best prebuilt level this CPU can run, among those present."""
    return next((lv for lv in LEVELS if lv.name in available and lv.needs <= flags), None)


def load() -> ModuleType | None:
    """The kernels' module, or None when disabled or neither found nor buildable."""
    if os.environ.get("KVPILOT_CPU_KERNELS", "1") == "0":
        return None
    return _load()


@functools.cache
def _load() -> ModuleType | None:
    root = os.environ.get(PREBUILT_ENV)
    if root:
        present = {p.parent.name for p in Path(root).glob(f"*/{NAME}*.so")}
        level = choose(cpu_flags(), present)
        if level is not None:
            try:
                module = _import(next((Path(root) / level.name).glob(f"{NAME}*.so")))
                log.info("CPU kernels: prebuilt for %s (%s)", level.name, Path(root) / level.name)
                return module
            except ImportError as exc:  # built against another torch: build here instead
                log.warning("CPU kernels prebuilt for %s do not load (%s)", level.name, exc)
        else:
            log.warning("CPU kernels: none of %s fits this CPU", sorted(present) or "(none)")
    native = ("-march=native",)
    try:
        from torch.utils.cpp_extension import _get_build_directory

        where = Path(_get_build_directory(NAME, verbose=False)) / source_key(native)
        module = build_once(NAME, native, where)
    except Exception as exc:  # no compiler, no ninja, unsupported platform: use PyTorch's ops
        log.warning("CPU kernels unavailable (%s); using the PyTorch path", exc)
        return None
    log.info("CPU kernels: for this CPU (-march=native), from %s", where)
    return module


def source_key(flags: tuple[str, ...]) -> str:
    """What a build depends on, hashed: every file of csrc/, the flags, torch, the interpreter
    and the CPU (-march=native means this one). Not the checkout's path: a second checkout of
    the same sources (a clean clone in CI, a worktree) reuses the build instead of compiling
    the same objects again, as ninja would, its commands naming other paths."""
    import torch

    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    given = [*FLAGS, *flags, torch.__version__, sys.implementation.cache_tag]
    digest.update("\0".join([*given, *sorted(cpu_flags())]).encode())
    return digest.hexdigest()[:16]


def build_once(name: str, flags: tuple[str, ...], where: Path) -> ModuleType:
    """The module built into `where`, a folder named by source_key(flags): imported as an
    earlier build left it, else built there (under build's lock) and marked done."""
    done = where / f"{name}.built"  # written last: the module it names is complete
    if done.is_file():
        return _import(where / done.read_text())
    log.info("CPU kernels: compiling %s, once; this takes a while", " ".join(flags))
    module = build(name, flags, str(where))
    done.write_text(Path(module.__file__ or "").name)
    return module


def _import(path: Path) -> ModuleType:
    import torch  # noqa: F401  (the module links against torch's libraries, loaded first)

    # torch names a second build of one name in one process NAME_v1: the file says which.
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python extension: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str, flags: tuple[str, ...] = (), directory: str | None = None) -> ModuleType:
    """Compile the module under `name`, with the given compiler flags (an -march, and variants
    the tests build).

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


def prebuild(root: Path) -> None:
    """Build the module for every level into root/<level>/ (the image's build step)."""
    for level in LEVELS:
        print(f"building CPU kernels for {level.name} ({' '.join(level.march)})", flush=True)
        build(NAME, level.march, str(root / level.name))
        for leftover in (root / level.name).iterdir():  # keep the module, not the objects
            if leftover.is_file() and leftover.suffix != ".so":
                leftover.unlink()


if __name__ == "__main__":
    prebuild(Path(sys.argv[1]))
