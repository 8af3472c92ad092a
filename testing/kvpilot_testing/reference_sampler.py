"""The engine's sampler as it was written first, one row at a time on the CPU with
torch.multinomial: the oracle the batched, device-agnostic sampler
(engine/runtime/sampler.py) is held to, token for token and logprob for logprob."""

import torch

from kvpilot_server.engine.runtime.sampler import Sampler, position_generator
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.outputs import Sample

_MAX = torch.finfo(torch.float32).max


class RowSampler:
    def __init__(self, eos_token_ids: list[int], seed: int = 0) -> None:
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Sample | Exception]:
        logits = logits.float().cpu()
        samples: list[Sample | Exception] = []
        for row, seq in zip(logits, seqs, strict=True):
            try:
                token = self._sample_row(row, seq)
            except RuntimeError as exc:  # a distribution left with nothing to draw from
                samples.append(exc)
                continue
            k = seq.params.logprobs
            samples.append(
                Sample(token) if k is None else Sampler.prompt_logprobs(row[None], [token], k)[0]
            )
        return samples

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        logits = logits.clone()
        if p.logit_bias:
            logits[torch.tensor(list(p.logit_bias))] += torch.tensor(list(p.logit_bias.values()))
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
            values = logits[seen]
            logits[seen] = torch.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
        output = seq.output_token_ids
        if output and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(output), minlength=logits.numel()).float()
            logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        if seq.num_output_tokens < p.min_tokens:
            banned = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_token_ids)]
            logits[banned] = float("-inf")
        if p.greedy:
            return int(logits.argmax())
        scaled = torch.nan_to_num(logits / p.temperature, nan=float("-inf"), posinf=_MAX)
        probs = _filter(torch.softmax(scaled, dim=-1), p.top_k, p.top_p, p.min_p)
        generator = (
            self.generator if p.seed is None else position_generator(p.seed, seq.num_output_tokens)
        )
        return int(torch.multinomial(probs, 1, generator=generator))


def _filter(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
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
