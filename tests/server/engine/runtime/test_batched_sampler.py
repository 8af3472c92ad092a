"""The sampler works on the batch as tensors on the logits' device; on the CPU it must choose
exactly what the first, row-by-row sampler chose (kvpilot_testing.reference_sampler): the same
tokens for greedy, seeded and unseeded rows, the same logprobs, the same rows refused."""

import random
from dataclasses import replace

import pytest
import torch

from kvpilot_server import SamplingParams
from kvpilot_server.engine.runtime.sampler import Sampler
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_testing.reference_sampler import RowSampler

VOCAB = 3000
EOS = [2, 7]


def _params(rng: random.Random) -> SamplingParams:
    """Every setting the sampler reads, each present in about a third of the rows."""
    pick = lambda chance, value, default: value if rng.random() < chance else default  # noqa: E731
    return SamplingParams(
        max_tokens=64,
        temperature=rng.choice([0.0, 0.0, 0.5, 1.0, 1.7]),
        top_k=pick(0.35, rng.choice([1, 5, 50, VOCAB + 5]), 0),
        top_p=pick(0.35, rng.choice([0.05, 0.5, 0.9]), 1.0),
        min_p=pick(0.25, rng.choice([0.01, 0.2]), 0.0),
        seed=pick(0.5, rng.randrange(2**40), None),
        presence_penalty=pick(0.3, rng.uniform(-2, 2), 0.0),
        frequency_penalty=pick(0.3, rng.uniform(-2, 2), 0.0),
        repetition_penalty=pick(0.3, rng.choice([0.5, 1.3, 1e-300]), 1.0),
        logit_bias=pick(0.3, {rng.randrange(VOCAB): rng.uniform(-99, 99) for _ in range(3)}, None),
        min_tokens=pick(0.3, rng.randrange(1, 8), 0),
        stop_token_ids=pick(0.3, [rng.randrange(VOCAB)], []),
        ignore_eos=rng.random() < 0.2,
        logprobs=pick(0.3, rng.choice([0, 1, 5]), None),
    )


def _batch(rng: random.Random, size: int) -> list[Sequence]:
    seqs = []
    for _ in range(size):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
        seq = Sequence("r", prompt, _params(rng), max_tokens=64)
        # Output so far: often repeats, so the count penalties see counts above 1.
        repeats = [*prompt[:3], rng.randrange(VOCAB)]
        seq.token_ids += [rng.choice(repeats) for _ in range(rng.randrange(6))]
        seqs.append(seq)
    return seqs


def _logits(size: int, generator: torch.Generator) -> torch.Tensor:
    logits = torch.randn(size, VOCAB, generator=generator) * 4
    logits[:, 100:110] = logits[:, 100:101]  # ties, as a real model's quantized logits have
    if size > 2:
        logits[1] = float("nan")  # a broken forward pass: a sampled row has nothing to draw
    return logits


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_the_batched_sampler_chooses_what_the_row_sampler_chose(batch):
    rng, noise = random.Random(batch), torch.Generator().manual_seed(batch)
    sampler, reference = Sampler(EOS, seed=11), RowSampler(EOS, seed=11)
    refused = drawn = 0
    for _ in range(40):
        seqs = _batch(rng, batch)
        logits = _logits(batch, noise)
        if batch > 2:
            # Row 1 has nothing to draw from. Seeded, because a refused unseeded row takes its
            # turn of the shared generator here, where the row sampler raised before its turn
            # (deliberately: knowing which rows fail first would cost a sync with the device).
            seqs[1].params = replace(seqs[1].params, temperature=1.0, seed=1)
        got, want = sampler.sample(logits, seqs), reference.sample(logits, seqs)
        for g, w, seq in zip(got, want, seqs, strict=True):
            assert isinstance(g, Exception) == isinstance(w, Exception), seq.params
            if isinstance(w, Exception):
                refused += 1
                continue
            drawn += not seq.params.greedy
            # repr: a NaN logprob (the broken row's, where it was chosen greedily) equals itself.
            got_row = repr((g.token_id, g.logprob, g.top_logprobs))
            assert got_row == repr((w.token_id, w.logprob, w.top_logprobs)), seq.params
    assert drawn > 10  # the random draws were compared, not only argmaxes
    assert refused or batch < 3


def test_a_refused_row_leaves_its_neighbours_draws_unchanged():
    # Unseeded rows share one generator: a row that cannot be sampled still takes its turn, so
    # the rows after it draw what they would have beside a healthy row.
    params = SamplingParams(max_tokens=4, temperature=1.0, repetition_penalty=1.3)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))

    def run(middle: torch.Tensor) -> list:
        seqs = [Sequence("r", list(range(50)), params, 4) for _ in range(3)]
        return Sampler(EOS, seed=5).sample(torch.stack([logits[0], middle, logits[2]]), seqs)

    with_broken, with_healthy = run(torch.full((VOCAB,), float("nan"))), run(logits[1])
    assert isinstance(with_broken[1], RuntimeError) and "invalid" in str(with_broken[1])
    assert with_broken[0] == with_healthy[0] and with_broken[2] == with_healthy[2]


def test_only_the_chosen_ids_leave_the_device(monkeypatch):
    # The logits are never copied to the host as a whole: Tensor.cpu is not called, and what
    # comes back (tolist) is one id per row, plus the logprobs asked for.
    calls = []
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: calls.append(self.shape))
    seqs = _batch(random.Random(4), 8)
    samples = Sampler(EOS).sample(_logits(8, torch.Generator().manual_seed(4)), seqs)
    assert len(samples) == 8 and calls == []
