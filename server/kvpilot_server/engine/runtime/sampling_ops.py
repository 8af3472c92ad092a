"""The sampler's steps as tensor operations over a batch of rows, on whatever device the logits
are on: nothing here copies logits to the host or loops over the vocabulary in Python.

Each step applies to the rows that ask for it and does, per row, the same float operations a
row-by-row sampler would (the same divisions, sums in the same order, the same sort), so a
seeded request draws the same token whatever else shares its batch. The draw itself is
torch.multinomial's own method for one sample, argmax(p / q) with q ~ Exp(1) drawn from the
row's generator: on the CPU that is bit for bit what torch.multinomial(p, 1, generator) returns,
and on any device it needs no host round trip.
"""

from collections.abc import Sequence as Seq

import torch

from kvpilot_server.sampling_params import SamplingParams

_MAX = torch.finfo(torch.float32).max


def _index(values: Seq[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _rows_and_ids(
    rows: Seq[int], ids: Seq[Seq[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (row, token id) index pairs: row rows[i] once for each id in ids[i]."""
    flat_rows = [r for r, row_ids in zip(rows, ids, strict=True) for _ in row_ids]
    flat_ids = [t for row_ids in ids for t in row_ids]
    return _index(flat_rows, device), _index(flat_ids, device)


def add_bias(logits: torch.Tensor, biases: dict[int, dict[int, float]]) -> None:
    """logits[row, token] += bias, for each row's {token: bias} (in place)."""
    if not biases:
        return
    rows, ids = _rows_and_ids(list(biases), [list(b) for b in biases.values()], logits.device)
    values = [v for b in biases.values() for v in b.values()]
    logits.index_put_((rows, ids), torch.tensor(values, device=logits.device), accumulate=True)


def repetition_penalty(
    logits: torch.Tensor, seen: dict[int, Seq[int]], penalty: dict[int, float]
) -> None:
    """vLLM's rule for each row's tokens seen in prompt or output: a positive logit divided by
    the penalty, a negative one multiplied (in place)."""
    if not seen:
        return
    device = logits.device
    rows = _index(list(seen), device)
    hit = torch.zeros(len(seen), logits.shape[-1], dtype=torch.bool, device=device)
    local, ids = _rows_and_ids(range(len(seen)), list(seen.values()), device)
    hit[local, ids] = True
    p = torch.tensor([penalty[r] for r in seen], device=device)[:, None]
    values = logits[rows]
    logits[rows] = torch.where(hit, torch.where(values > 0, values / p, values * p), values)


def count_penalties(
    logits: torch.Tensor,
    outputs: dict[int, Seq[int]],
    presence: dict[int, float],
    frequency: dict[int, float],
) -> None:
    """logits -= frequency x count + presence x (count > 0), over each row's output tokens."""
    if not outputs:
        return
    device = logits.device
    rows = _index(list(outputs), device)
    local, ids = _rows_and_ids(range(len(outputs)), list(outputs.values()), device)
    counts = torch.zeros(len(outputs), logits.shape[-1], device=device)
    counts.index_put_((local, ids), torch.ones(len(ids), device=device), accumulate=True)
    f = torch.tensor([frequency[r] for r in outputs], device=device)[:, None]
    pr = torch.tensor([presence[r] for r in outputs], device=device)[:, None]
    logits[rows] = logits[rows] - (f * counts + pr * (counts > 0).to(logits.dtype))


def ban(logits: torch.Tensor, banned: dict[int, Seq[int]]) -> None:
    """-inf for each row's banned tokens (stop tokens before min_tokens)."""
    if banned:
        rows, ids = _rows_and_ids(list(banned), list(banned.values()), logits.device)
        logits[rows, ids] = float("-inf")


def probabilities(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """softmax(logits / temperature) per row. Extreme penalties or temperatures overflow to inf,
    and softmax(inf) is NaN: they are capped first."""
    scaled = torch.nan_to_num(logits / temperature[:, None], nan=float("-inf"), posinf=_MAX)
    return torch.softmax(scaled, dim=-1)


def filter_probs(probs: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
    """Zero out each row's tokens outside its top-k, then outside its top-p nucleus, then under
    its min-p floor; never all of them (the largest always stays)."""
    device, vocab = probs.device, probs.shape[-1]
    top_k = [p.top_k if p.top_k and p.top_k < vocab else 0 for p in params]
    if any(top_k):
        ranked = probs.sort(dim=-1, descending=True).values
        k = _index([max(k, 1) for k in top_k], device)[:, None]
        unlimited = torch.tensor([k == 0 for k in top_k], device=device)[:, None]
        probs = torch.where((probs >= ranked.gather(1, k - 1)) | unlimited, probs, 0.0)
    nucleus = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if nucleus:
        rows = _index(nucleus, device)
        part = probs[rows]
        sorted_probs, order = part.sort(dim=-1, descending=True)
        top_p = torch.tensor([params[i].top_p for i in nucleus], device=device)[:, None]
        total = sorted_probs.sum(dim=-1, keepdim=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p * total
        probs = probs.clone()
        probs[rows] = part.scatter(1, order, sorted_probs.masked_fill(outside, 0.0))
    floor = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if floor:
        rows = _index(floor, device)
        part = probs[rows]
        min_p = torch.tensor([params[i].min_p for i in floor], device=device)[:, None]
        probs = probs.clone()
        probs[rows] = torch.where(part >= min_p * part.amax(dim=-1, keepdim=True), part, 0.0)
    return probs


def draw(probs: torch.Tensor, generators: Seq[torch.Generator]) -> torch.Tensor:
    """One token per row: argmax(p / q), q ~ Exp(1) from that row's generator, in row order (a
    generator shared by several rows advances as it would for them one after another)."""
    q = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        q[row].exponential_(1, generator=generator)
    return (probs / q).argmax(dim=-1)


def invalid_rows(probs: torch.Tensor) -> torch.Tensor:
    """Rows no token can be drawn from, as torch.multinomial judges them: a NaN, an infinity or
    a negative entry, or nothing left with any probability."""
    bad = ~(probs.amax(dim=-1) < float("inf")) | (probs.amin(dim=-1) < 0)
    return bad | (probs.sum(dim=-1) == 0)
