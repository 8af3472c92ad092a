"""Turn next-token logits into tokens: penalties, temperature, top-k/top-p/min-p, seeds, logprobs.

A structured-output row's disallowed tokens are masked to -inf first (engine/structured/masks.py),
so every mode below, and the logprobs, see the constrained distribution, as in vLLM.
Greedy batches without penalties take one argmax over the batch. Everything else goes row by
row. A seeded request's draw at output position k comes from a generator seeded with (seed, k),
not from one generator's history: its samples do not depend on what else shares the batch, and
a continuation from position k (continue_from: another replica taking over a broken stream)
draws exactly what the uninterrupted run would have. A row that cannot be sampled comes back as
its exception, so one request's extreme settings fail that request alone.
"""

import hashlib

import torch

from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.engine.structured.masks import StepMasks
from kvpilot_server.outputs import Sample

_MAX = torch.finfo(torch.float32).max


class Sampler:
    def __init__(self, eos_token_ids: list[int], seed: int = 0) -> None:
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator().manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], masks: StepMasks | None = None
    ) -> list[Sample | Exception]:
        logits = logits.float().cpu()
        failed = {}
        if masks is not None:  # on a copy: the caller's logits may be this very tensor
            logits = logits.clone()
            failed = masks.apply(logits, [s.seq_id for s in seqs])
        if failed:
            samples = self.sample(logits, seqs)  # the failed rows' samples are dropped
            return [failed.get(i, sample) for i, sample in enumerate(samples)]
        if all(s.params.greedy and not self._needs_processing(s) for s in seqs):
            tokens = logits.argmax(dim=-1).tolist()
            return [
                self._with_logprobs(row, token, seq)
                for row, token, seq in zip(logits, tokens, seqs, strict=True)
            ]
        samples: list[Sample | Exception] = []
        for row, seq in zip(logits, seqs, strict=True):
            try:
                samples.append(self._with_logprobs(row, self._sample_row(row, seq), seq))
            except Exception as exc:  # e.g. a distribution left with nothing to draw from
                samples.append(exc)
        return samples

    def _needs_processing(self, seq: Sequence) -> bool:
        return seq.params.processed or seq.num_output_tokens < seq.params.min_tokens

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        logits = logits.clone()
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias))
            logits[ids] += torch.tensor(list(p.logit_bias.values()))
        if p.penalized:
            apply_penalties(logits, seq)
        if seq.num_output_tokens < p.min_tokens:
            banned = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_token_ids)]
            logits[banned] = float("-inf")
        if p.greedy:
            return int(logits.argmax())
        # Extreme penalties or temperatures overflow to inf, and softmax(inf) is NaN: cap them.
        scaled = torch.nan_to_num(logits / p.temperature, nan=float("-inf"), posinf=_MAX)
        probs = filter_probs(torch.softmax(scaled, dim=-1), p.top_k, p.top_p, p.min_p)
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)))

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.params.seed is None:
            return self.generator
        return position_generator(seq.params.seed, seq.num_output_tokens)

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[Sample]:
        """Each row's logprob of the token that follows it (a prompt token), plus its k best.
        Logprobs of the model's raw distribution, as vLLM reports them by default."""
        logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
        chosen = logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        if not k:
            return [Sample(t, v, []) for t, v in zip(tokens, chosen, strict=True)]
        top = torch.topk(logprobs, k)
        pairs = zip(top.indices.tolist(), top.values.tolist(), strict=True)
        return [
            Sample(t, v, list(zip(ids, values, strict=True)))
            for t, v, (ids, values) in zip(tokens, chosen, pairs, strict=True)
        ]

    @classmethod
    def _with_logprobs(cls, logits: torch.Tensor, token: int, seq: Sequence) -> Sample:
        k = seq.params.logprobs
        if k is None:
            return Sample(token)
        return cls.prompt_logprobs(logits[None], [token], k)[0]


def position_generator(seed: int, position: int) -> torch.Generator:
    """The generator of a seeded request's draw at output `position`: (seed, position) hashed
    to a 64-bit seed, so neighbouring seeds and positions give unrelated streams."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """vLLM's semantics: repetition over prompt and output; presence/frequency over output."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / p.repetition_penalty, values * p.repetition_penalty
        )
    output = seq.output_token_ids
    if output and (p.presence_penalty or p.frequency_penalty):
        counts = torch.bincount(torch.tensor(output), minlength=logits.numel()).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def filter_probs(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Zero out tokens outside top-k, the top-p nucleus and the min-p floor; never all of them."""
    if top_k and top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(0) - sorted_probs > top_p * sorted_probs.sum()
        probs = probs.scatter(0, order[outside], 0.0)
    if min_p > 0.0:
        probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    return probs
