"""Large host tensors on 2 MiB pages: the weights and the KV cache of a CPU model.

A decode step reads every weight once and each sequence's KV blocks scattered over the cache; on
4 KiB pages nearly every few kilobytes read is a new page, and the TLB misses cost memory
bandwidth (benchmarks/engine_throughput.py times the whole). Most hosts, and Kubernetes nodes, run
transparent huge pages in `madvise` mode: a region is backed by huge pages at its first touch
only where the process asked for them. So the weights and the cache ask, between allocation and
the first write. Where the kernel cannot (another OS, THP `never`), nothing changes.

Only whole 2 MiB pages inside a region can be huge, and a decoder matrix of a few MiB alone
holds one or two: weights that stay as loaded share one buffer (place()), and the KV cache is
one allocation per layer of tens of MiB.
"""

import ctypes
import functools
import logging

import torch

log = logging.getLogger(__name__)

HUGE = 2 << 20
MADV_DONTNEED, MADV_HUGEPAGE = 4, 14  # linux/mman.h
ALIGN = 64  # each placed tensor starts on a cache line, as an allocation of its own would


@functools.cache
def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):  # not glibc or musl on Linux: nothing to ask
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


def advise(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under the 2 MiB-aligned interior of a CPU tensor's memory, before it
    is first written. True where the kernel agreed. The allocator may hand out memory it had
    touched before (a freed chunk of its heap, not a fresh mapping), whose 4 KiB pages would
    stay: they are dropped first, which loses nothing of a tensor not yet written."""
    madvise = _madvise()
    if madvise is None or tensor.device.type != "cpu":
        return False
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    first, last = -(-start // HUGE) * HUGE, end // HUGE * HUGE
    if last <= first:  # smaller than a huge page's aligned span
        return False
    if madvise(first, last - first, MADV_DONTNEED) != 0:
        log.debug("madvise(MADV_DONTNEED) refused: errno %d", ctypes.get_errno())
        return False
    if madvise(first, last - first, MADV_HUGEPAGE) != 0:
        log.debug("madvise(MADV_HUGEPAGE) refused: errno %d", ctypes.get_errno())
        return False
    return True


def advise_module(module: torch.nn.Module) -> None:
    """advise() every parameter and buffer of a module just allocated (to_empty), each alone."""
    for tensor in [*module.parameters(), *module.buffers()]:
        advise(tensor)


def place(module: torch.nn.Module) -> None:
    """Move every host parameter of a module just allocated (to_empty: nothing written yet) into
    one advised buffer per dtype. Nothing is copied, and a tied parameter is placed once. Only
    for weights that are never replaced: the buffer lives while any of them does, so a
    quantized layer would keep its float original's memory."""
    groups: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for param in module.parameters():  # each tied parameter once
        if param.device.type == "cpu":
            groups.setdefault(param.dtype, []).append(param)
    for dtype, params in groups.items():
        sizes = [param.numel() * param.element_size() for param in params]
        buffer = torch.empty(sum(-(-size // ALIGN) * ALIGN for size in sizes), dtype=torch.uint8)
        advise(buffer)
        at = 0
        for param, size in zip(params, sizes, strict=True):
            param.data = buffer[at : at + size].view(dtype).view(param.shape)
            at += -(-size // ALIGN) * ALIGN
