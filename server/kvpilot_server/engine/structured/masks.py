"""Allowed-token masks of a step's constrained sequences, computed while the model runs.

Before the forward pass the engine hands the matchers of the sequences that will sample to a
thread; llguidance computes their masks in parallel with the GIL released, so the mask costs
(almost) nothing next to the model. The sampler then sets every disallowed logit to -inf,
before penalties, temperature and logprobs, for every sampling mode.
"""

from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import torch

from kvpilot_server.engine.structured.grammar import UnsatisfiableError


class StepMasks:
    """The masks of one step: a row of bits per constrained sequence (by seq_id)."""

    def __init__(self, bitmask: torch.Tensor, rows: dict[int, int], errors: dict[int, str]):
        self.bitmask, self.rows, self.errors = bitmask, rows, errors

    def apply(self, logits: torch.Tensor, seq_ids: list[int]) -> dict[int, Exception]:
        """Mask logits (row i belongs to seq_ids[i]) in place; rows whose grammar failed come
        back as their error, to fail those requests alone."""
        failed: dict[int, Exception] = {}
        picked, sources = [], []
        for i, seq_id in enumerate(seq_ids):
            if seq_id in self.errors:
                failed[i] = UnsatisfiableError(self.errors[seq_id])
            elif seq_id in self.rows:
                picked.append(i)
                sources.append(self.rows[seq_id])
        if not picked:
            return failed
        # The grammar's words live on the host (llguidance fills them); the logits may not.
        bias = biases(self.bitmask[sources], logits.shape[-1]).to(logits.device)
        if len(picked) == logits.shape[0]:  # every row constrained: no gather and scatter
            logits += bias
        else:
            logits[torch.tensor(picked, device=logits.device)] += bias
        return failed


# Each byte value's 8 token bits as additive biases: 0 where allowed, -inf where not. One table
# lookup and one add: on CPU that beat shifting the bits out and masked_fill several times over.
_BYTE_BIASES = torch.where(
    ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool(), 0.0, float("-inf")
)


def biases(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 words of 32 token bits (token 32w + j is bit j of word w) -> float [rows,
    vocab_size] of 0 / -inf. Read as bytes: little-endian, so byte k of word w holds tokens
    32w + 8k ... 32w + 8k + 7, lowest bit first."""
    rows = bitmask.shape[0]
    return _BYTE_BIASES[bitmask.view(torch.uint8).long()].reshape(rows, -1)[:, :vocab_size]


class MaskWorker:
    """One thread beside the engine's: start() before the forward pass, result after it.

    The thread runs no torch operation: torch's CPU ops on a second thread start a second
    OpenMP team, whose spinning threads slow every step of the engine thread's own team. The
    buffer is allocated by the caller, and the thread only calls into llguidance."""

    def __init__(self, vocab_size: int) -> None:
        self.words = (vocab_size + 31) // 32
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvpilot-masks")
        self._executor = llguidance.LLExecutor()

    def start(self, matchers: dict[int, llguidance.LLMatcher]) -> Future[StepMasks]:
        bitmask = torch.zeros((len(matchers), self.words), dtype=torch.int32)
        return self._pool.submit(self.compute, matchers, bitmask)

    def compute(
        self, matchers: dict[int, llguidance.LLMatcher], bitmask: torch.Tensor
    ) -> StepMasks:
        # llguidance.torch is not imported: it compiles a kernel with torch.compile on import.
        ordered = list(matchers.items())
        targets = [(matcher, i) for i, (_, matcher) in enumerate(ordered)]
        self._executor.unsafe_compute_mask_ptr(
            targets, bitmask.data_ptr(), self.words * 4, len(ordered)
        )
        rows, errors = {}, {}
        for i, (seq_id, matcher) in enumerate(ordered):
            if matcher.is_error():
                errors[seq_id] = matcher.get_error()
            else:
                rows[seq_id] = i
        return StepMasks(bitmask, rows, errors)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
