"""Turn next-token logits into tokens: penalties, temperature, top-k/top-p/min-p, seeds, logprobs.

A structured-output row's disallowed tokens are masked to -inf first (engine/structured/masks.py),
so every mode below, and the logprobs, see the constrained distribution, as in vLLM.
The whole batch is processed as tensors on the logits' own device (runtime/sampling_ops.py), and
only the chosen token ids (and the logprobs asked for) are copied back: on a GPU, a [batch,
vocab] copy to the host every step would be a sync and most of a small step's time. Greedy
batches without penalties take one argmax. A seeded request's draw at output position k comes
from a generator seeded with (seed, k), not from one generator's history: its samples do not
depend on what else shares the batch, and a continuation from position k (continue_from:
another replica taking over a broken stream) draws exactly what the uninterrupted run would
have. A row that cannot be sampled comes back as its exception, so one request's extreme
settings fail that request alone.
"""

import hashlib

import torch

from kvpilot_server.engine.runtime import sampling_ops as ops
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.engine.structured.masks import StepMasks
from kvpilot_server.outputs import Sample

# torch.multinomial's words for a row it cannot draw from, kept so errors read as before.
UNSAMPLEABLE = "invalid multinomial distribution (a NaN, an infinity, a negative or all zeros)"


class Sampler:
    def __init__(self, eos_token_ids: list[int], seed: int = 0) -> None:
        self.eos_token_ids = eos_token_ids
        self.seed = seed
        # Unseeded rows share one generator per device, seeded with the engine's seed.
        self._shared: dict[torch.device, torch.Generator] = {}

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], masks: StepMasks | None = None
    ) -> list[Sample | Exception]:
        logits = logits.float()
        failed: dict[int, Exception] = {}
        if masks is not None:  # on a copy: the caller's logits may be this very tensor
            logits = logits.clone()
            failed = masks.apply(logits, [s.seq_id for s in seqs])
        if failed:
            samples = self.sample(logits, seqs)  # the failed rows' samples are dropped
            return [failed.get(i, sample) for i, sample in enumerate(samples)]
        if all(s.params.greedy and not self._needs_processing(s) for s in seqs):
            tokens, errors = logits.argmax(dim=-1).tolist(), set()
        else:
            tokens, errors = self._choose(logits, seqs)
        samples = self._with_logprobs(logits, tokens, seqs)
        return [RuntimeError(UNSAMPLEABLE) if i in errors else s for i, s in enumerate(samples)]

    def _needs_processing(self, seq: Sequence) -> bool:
        return seq.params.processed or seq.num_output_tokens < seq.params.min_tokens

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], set[int]]:
        """Each row's token, and the rows that could not be sampled."""
        x = logits.clone()
        rows = list(enumerate(seqs))
        params = {i: s.params for i, s in rows}
        ops.add_bias(x, {i: p.logit_bias for i, p in params.items() if p.logit_bias})
        repeat = {i: s.token_ids for i, s in rows if s.params.repetition_penalty != 1.0}
        ops.repetition_penalty(x, repeat, {i: params[i].repetition_penalty for i in repeat})
        counted = {
            i: s.output_token_ids
            for i, s in rows
            if s.output_token_ids and (s.params.presence_penalty or s.params.frequency_penalty)
        }
        presence = {i: params[i].presence_penalty for i in counted}
        ops.count_penalties(x, counted, presence, {i: params[i].frequency_penalty for i in counted})
        early = [(i, s) for i, s in rows if s.num_output_tokens < s.params.min_tokens]
        ops.ban(x, {i: self._banned(s) for i, s in early})
        tokens = x.argmax(dim=-1)
        drawn = [i for i, p in params.items() if not p.greedy]
        refused = torch.zeros_like(tokens)  # 1: the row could not be sampled
        if drawn:
            index = torch.tensor(drawn, device=x.device)
            temperature = torch.tensor([params[i].temperature for i in drawn], device=x.device)
            probs = ops.probabilities(x[index], temperature)
            probs = ops.filter_probs(probs, [params[i] for i in drawn])
            bad = ops.invalid_rows(probs)
            # A bad row draws from a uniform stand-in (its result is dropped), so the others'
            # draws are made exactly as if it were fine.
            probs = torch.where(bad[:, None], 1.0, probs)
            tokens[index] = ops.draw(probs, [self._generator(seqs[i], x.device) for i in drawn])
            refused[index] = bad.to(refused.dtype)
        # One copy back for both: on a GPU each read of the device is a sync.
        chosen, failed = torch.stack((tokens, refused)).tolist()
        return chosen, {i for i, flag in enumerate(failed) if flag}

    def _banned(self, seq: Sequence) -> list[int]:
        p = seq.params
        return [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_token_ids)]

    def _generator(self, seq: Sequence, device: torch.device) -> torch.Generator:
        if seq.params.seed is None:
            shared = self._shared.get(device)
            if shared is None:
                shared = torch.Generator(device=device).manual_seed(self.seed)
                self._shared[device] = shared
            return shared
        return position_generator(seq.params.seed, seq.num_output_tokens, device)

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[Sample]:
        """Each row's logprob of the token that follows it (a prompt token), plus its k best.
        Logprobs of the model's raw distribution, as vLLM reports them by default."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        index = torch.tensor(tokens, device=logprobs.device)[:, None]
        chosen = logprobs.gather(1, index)[:, 0].tolist()
        if not k:
            return [Sample(t, v, []) for t, v in zip(tokens, chosen, strict=True)]
        top = torch.topk(logprobs, k)
        pairs = zip(top.indices.tolist(), top.values.tolist(), strict=True)
        return [
            Sample(t, v, list(zip(ids, values, strict=True)))
            for t, v, (ids, values) in zip(tokens, chosen, pairs, strict=True)
        ]

    @classmethod
    def _with_logprobs(
        cls, logits: torch.Tensor, tokens: list[int], seqs: list[Sequence]
    ) -> list[Sample]:
        """Each row's sample, with the logprobs its request asked for: one pass per distinct k
        over the rows that asked for it."""
        samples = [Sample(token) for token in tokens]
        wanted: dict[int, list[int]] = {}
        for i, seq in enumerate(seqs):
            if seq.params.logprobs is not None:
                wanted.setdefault(seq.params.logprobs, []).append(i)
        for k, rows in wanted.items():
            index = torch.tensor(rows, device=logits.device)
            found = cls.prompt_logprobs(logits[index], [tokens[i] for i in rows], k)
            for i, sample in zip(rows, found, strict=True):
                samples[i] = sample
        return samples


def position_generator(
    seed: int, position: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """The generator of a seeded request's draw at output `position`, on the device that draws:
    (seed, position) hashed to a 64-bit seed, so neighbouring seeds and positions give
    unrelated streams. Streams are reproducible per device type, not across types (a GPU's
    generator is not the CPU's)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little"))
