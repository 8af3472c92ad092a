"""From a workload to the list of requests to send: when, of which class, how long in and out,
whether and when the client gives up. Pure and seeded: the same workload and seed give the same
plan, so two endpoints (compare mode) or two runs see the same requests.

Arrivals stop at duration_s or max_requests, whichever comes first. Poisson arrivals with a rate
that changes (ramp, step) are drawn by thinning a Poisson process at the highest rate.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvpilot_bench.workload import Arrival, Distribution, RequestClass, Variant, Workload

_CHUNK = 4096  # candidate arrivals drawn at a time


@dataclass(frozen=True)
class Planned:
    index: int
    at: float  # seconds after the run starts
    cls: RequestClass
    prompt_tokens: int
    output_tokens: int
    cancel_after_s: float | None  # the client closes the request this long after sending it
    cancel_after_tokens: int | None  # ... or after receiving this many streamed tokens
    text_seed: int  # picks the prompt text
    variant: int | None = None  # which of the class's structured variants (None: none)

    @property
    def structured(self) -> Variant | None:
        return None if self.variant is None else self.cls.structured[self.variant]


def sample(dist: Distribution, rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` draws of `dist`, clamped to its min/max when it has them (floats)."""
    p = dist.params
    if dist.dist == "fixed":
        values = np.full(size, p["value"])
    elif dist.dist == "uniform":
        values = rng.uniform(p["min"], p["max"], size)
    elif dist.dist == "normal":
        values = rng.normal(p["mean"], p["std"], size)
    elif dist.dist == "lognormal":
        values = rng.lognormal(np.log(p["median"]), p["sigma"], size)
    else:
        raise ValueError(f"unknown distribution {dist.dist!r}")
    return np.clip(values, p.get("min", 0.0), p.get("max", np.inf))


def _tokens(dist: Distribution, rng: np.random.Generator, size: int) -> np.ndarray:
    return np.maximum(1, np.rint(sample(dist, rng, size))).astype(int)


def _thinned(
    rate: Callable[[np.ndarray], np.ndarray],
    top: float,
    end: float,
    limit: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times in [0, end) of a Poisson process of intensity rate(t) <= top."""
    if top <= 0:
        return np.empty(0)
    found: list[np.ndarray] = []
    count, t = 0, 0.0
    while t < end and count < limit:
        times = t + np.cumsum(rng.exponential(1.0 / top, _CHUNK))
        t = float(times[-1])
        keep = times[(times < end) & (rng.uniform(0.0, top, _CHUNK) < rate(times))]
        found.append(keep)
        count += len(keep)
    return np.concatenate(found)[:limit]


def arrival_times(arrival: Arrival, end: float, limit: int, rng: np.random.Generator) -> np.ndarray:
    p = arrival.params
    if arrival.process == "constant":
        n = min(limit, int(np.ceil(end * p["rate"])))
        return np.arange(n) / p["rate"]
    if arrival.process == "burst":
        bursts = int(np.ceil(end / p["every_s"]))
        return (np.repeat(np.arange(bursts) * p["every_s"], p["size"]))[:limit]
    if arrival.process == "poisson":
        r = p["rate"]
        return _thinned(lambda t: np.full_like(t, r), r, end, limit, rng)
    if arrival.process == "ramp":
        lo, hi, over = p["from_rate"], p["to_rate"], p["over_s"]
        return _thinned(
            lambda t: lo + (hi - lo) * np.minimum(t / over, 1.0), max(lo, hi), end, limit, rng
        )
    if arrival.process == "step":
        edges = np.cumsum([s["duration_s"] for s in p["steps"]])
        rates = np.array([s["rate"] for s in p["steps"]] + [0.0])
        return _thinned(
            lambda t: rates[np.searchsorted(edges, t, side="right")],
            float(rates.max()),
            min(end, float(edges[-1])),
            limit,
            rng,
        )
    raise ValueError(f"unknown arrival process {arrival.process!r}")


def build(workload: Workload) -> list[Planned]:
    rng = np.random.default_rng(workload.seed)
    times = arrival_times(workload.arrival, workload.duration_s, workload.max_requests, rng)
    n = len(times)
    shares = np.array([c.share for c in workload.classes])
    which = rng.choice(len(shares), size=n, p=shares / shares.sum())
    text_seeds = rng.integers(0, 2**31, size=n)
    columns = {}
    for k, cls in enumerate(workload.classes):
        # Each class draws from its own stream: adding a class does not change another's draws.
        crng = np.random.default_rng([workload.seed, k])
        prompt, output = _tokens(cls.prompt_tokens, crng, n), _tokens(cls.output_tokens, crng, n)
        cancels = crng.uniform(size=n) < (cls.cancel.probability if cls.cancel else 0.0)
        after_s = after_tok = None
        if cls.cancel and cls.cancel.after_ms:
            after_s = sample(cls.cancel.after_ms, crng, n) / 1000.0
        if cls.cancel and cls.cancel.after_tokens:
            after_tok = _tokens(cls.cancel.after_tokens, crng, n)
        variants = None  # drawn last: a class without variants draws what it always drew
        if cls.structured:
            weights = np.array([v.weight for v in cls.structured])
            variants = crng.choice(len(weights), size=n, p=weights / weights.sum())
        columns[k] = (prompt, output, cancels, after_s, after_tok, variants)
    plan = []
    for i in range(n):
        k = int(which[i])
        prompt, output, cancels, after_s, after_tok, variants = columns[k]
        cancel = bool(cancels[i])
        plan.append(
            Planned(
                index=i,
                at=float(times[i]),
                cls=workload.classes[k],
                prompt_tokens=int(prompt[i]),
                output_tokens=int(output[i]),
                cancel_after_s=float(after_s[i]) if cancel and after_s is not None else None,
                cancel_after_tokens=int(after_tok[i]) if cancel and after_tok is not None else None,
                text_seed=int(text_seeds[i]),
                variant=None if variants is None else int(variants[i]),
            )
        )
    return plan
