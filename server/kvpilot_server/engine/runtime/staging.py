"""A step's integer inputs on their way to the device: packed on the host into one buffer and
sent in one copy.

On a GPU, `torch.tensor(list, device="cuda")` copies from pageable memory, which the host waits
for, and an eager step made several (token ids, positions, cache slots, logit rows, the flash
path's lengths and block table). Here the numbers are written into one pinned host buffer and
sent with one non-blocking copy, so the host goes on to the step's launches at once. The host
buffer is rewritten only after the last copy out of it has finished (an event); the device
buffer only by a copy queued on the same stream after the kernels that read the last step's.

On a CPU the same packing runs, unpinned and copied into a fresh tensor, so the CPU tests run
every line but the pinning. Before a GPU serves with it, `works` sends known numbers through it
and reads them back: where they differ or the copy fails, the engine keeps sending each list
on its own, as before.
"""

import logging
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)
# Elements of the first buffer; it doubles when a step needs more.
INITIAL_SIZE = 4096


class Staging:
    def __init__(self, device: torch.device, one_copy: bool | None = None) -> None:
        """one_copy: send through a device buffer reused every step (the GPU's way; a CPU test
        can ask for it), rather than into a fresh tensor."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.one_copy = self.cuda if one_copy is None else one_copy
        self.host = torch.empty(0, dtype=torch.long)
        self.target: torch.Tensor | None = None  # one_copy: where the copy lands
        self.copied = torch.cuda.Event() if self.cuda else None
        self.packed = True  # False: each list sent on its own (works() failed)

    def send(self, parts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Each list as an int64 tensor on the device, in order."""
        if not self.packed:
            return [torch.tensor(part, dtype=torch.long, device=self.device) for part in parts]
        sizes = [len(part) for part in parts]
        total = sum(sizes)
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of the host buffer has finished
        if total > self.host.numel():
            self._grow(total)
        host = self.host.numpy()
        at = 0
        for part, n in zip(parts, sizes, strict=True):
            host[at : at + n] = part
            at += n
        if self.target is None:
            sent = self.host[:total].clone()
        else:
            sent = self.target[:total]
            sent.copy_(self.host[:total], non_blocking=True)
            if self.copied is not None:  # on the stream the copy went to: the target's device's
                self.copied.record(torch.cuda.current_stream(self.device))
        return list(sent.split(sizes))

    def works(self) -> bool:
        """Whether known numbers come back as sent (a start-up check: on a GPU this path has
        otherwise never run); if not, the log says why and lists go on their own from now."""
        parts = [[3, 1, 4], [], [1, 5, 9, 2, 6], [-1, 2**40]]
        try:
            back = [t.cpu().tolist() for t in self.send(parts)]
            error = "" if back == parts else f"sent {parts}, read back {back}"
        except Exception as exc:  # never run on this device: no failure may stop the start
            error = f"{type(exc).__name__}: {exc}"
        if error:
            log.warning(
                "packed step inputs failed their check (%s): sending each list alone", error
            )
            self.packed = False
        return not error

    def _grow(self, total: int) -> None:
        size = max(total, 2 * self.host.numel(), INITIAL_SIZE)
        self.host = torch.empty(size, dtype=torch.long, pin_memory=self.cuda)
        if self.one_copy:
            self.target = torch.empty(size, dtype=torch.long, device=self.device)
