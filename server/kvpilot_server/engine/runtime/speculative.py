"""Speculative decoding by prompt lookup: guess a sequence's next tokens from its own text, check
them all in one forward pass.

Summaries, extraction, code edits and answers over retrieved text copy long spans of what the
request already contains. The proposer matches the last n tokens (n from prompt_lookup_max down
to prompt_lookup_min) against everything before them, prompt and output alike, and proposes the
tokens that followed the latest match. The scheduler gives the sequence those draft tokens as
extra positions of its step; the model runner scores every position (each one a decode query
of its own, so the decode kernels serve them, reading the KV cache in place); `verify` keeps
what the model itself would have generated.

Verification samples each position exactly as a step without drafts would (the same sampler,
penalties, min_tokens and seeded generator position, the accepted drafts counted as output),
and accepts a draft token when the sample equals it; the first sample that differs is kept as
the step's last token, and when every draft is accepted the last position's sample is a bonus.
For a draft that is one token with certainty (a lookup is), this is the standard rejection rule
(accept d with probability min(1, p(d) / q(d)) = p(d), else draw from p without d), so the
output distribution is unchanged, and a seeded request draws the very tokens it draws without
speculation. Greedy output is the same tokens.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.sampler import Sampler
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.outputs import Sample


@dataclass(frozen=True)
class NgramProposer:
    num_tokens: int  # most draft tokens a step
    lookup_max: int  # longest suffix matched
    lookup_min: int  # shortest suffix matched

    @classmethod
    def of(cls, config: EngineConfig) -> "NgramProposer | None":
        if config.speculative == "none":
            return None
        return cls(
            config.num_speculative_tokens, config.prompt_lookup_max, config.prompt_lookup_min
        )

    def propose(self, token_ids: list[int], limit: int) -> list[int]:
        """Up to min(num_tokens, limit) tokens that followed the latest earlier occurrence of
        the longest suffix of token_ids that occurs before, or none."""
        k = min(self.num_tokens, limit)
        if k <= 0 or len(token_ids) <= self.lookup_min:
            return []
        tokens = torch.tensor(token_ids, dtype=torch.long)
        end = len(tokens)
        # Candidate starts of an earlier occurrence: where the last token appears before the end.
        candidates = torch.nonzero(tokens[: end - 1] == tokens[end - 1]).flatten()
        for n in range(min(self.lookup_max, end - 1), self.lookup_min - 1, -1):
            # An occurrence of the n-token suffix ending at candidate c covers [c - n + 1, c].
            starts = candidates[candidates >= n - 1] - (n - 1)
            if len(starts) == 0:
                continue
            windows = tokens[: end - 1].unfold(0, n, 1)  # a view: windows[s] = tokens[s : s + n]
            hits = starts[(windows[starts] == tokens[end - n :]).all(dim=1)]
            if len(hits):
                follow = int(hits[-1]) + n  # the latest occurrence: nearest text copies best
                return tokens[follow : follow + k].tolist()
        return []


def verify(
    sampler: Sampler, logits: torch.Tensor, seq: Sequence, draft: list[int]
) -> list[Sample] | Exception:
    """The tokens a step with `draft` produces: logits holds one row per position scored (the
    sequence's last token, then each draft token). Between 1 and len(draft) + 1 samples, or the
    exception that made a row unsampleable."""
    added = 0
    samples: list[Sample] = []
    try:
        for i, row in enumerate(logits):
            (sample,) = sampler.sample(row[None], [seq])
            if isinstance(sample, Exception):
                return sample
            samples.append(sample)
            if i == len(draft) or sample.token_id != draft[i]:
                break
            # The next position samples as if this token were already the sequence's own.
            seq.token_ids.append(draft[i])
            added += 1
    finally:
        del seq.token_ids[len(seq.token_ids) - added :]
    return samples


@dataclass
class Counts:
    """Totals since start, as vLLM's spec_decode counters count them: steps where a sequence
    had a draft, draft tokens proposed, draft tokens accepted."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def count(
        self, drafts: Mapping[Sequence, tuple[int, ...]], tokens: Mapping[Sequence, list[int]]
    ) -> None:
        for seq, draft in drafts.items():
            self.drafts += 1
            self.draft_tokens += len(draft)
            self.accepted_tokens += len(tokens.get(seq, [None])) - 1

    def snapshot(self) -> "Counts":
        return replace(self)
