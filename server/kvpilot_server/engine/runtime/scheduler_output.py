"""One step in the two forms it travels in.

SchedulerOutput is the scheduler's decision, on rank 0 alone: it names live sequences, which the
engine, the model runner and the scheduler's own update all read after it. StepPlan is what the
model runner makes of it for every rank: plain numbers, cheap to pickle to the tensor-parallel
workers (engine/distributed/workers.py sends it), which hold no sequences at all.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvpilot_server.engine.runtime.sequence import Sequence


@dataclass(frozen=True)
class SchedulerOutput:
    """Each sequence to run this step with the number of new tokens it computes: running ones
    first, then those admitted from the waiting queues (the order the scheduler took them in).
    An empty one means there is nothing to run."""

    # Read-only: the runner, the update and the engine's bookkeeping must see one decision.
    num_new_tokens: Mapping[Sequence, int] = field(default_factory=dict)
    # Speculative decoding: a decoding sequence's draft tokens, counted in its num_new_tokens
    # after its last token (engine/runtime/speculative.py).
    drafts: Mapping[Sequence, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_new_tokens", MappingProxyType(dict(self.num_new_tokens)))
        object.__setattr__(self, "drafts", MappingProxyType(dict(self.drafts)))


@dataclass(frozen=True)
class ScheduledSeq:
    """What attention needs of one sequence in a step."""

    computed: int  # tokens already in the KV cache
    n: int  # tokens computed in this step
    length: int  # the sequence's length: decodes of similar length share a padded group
    block_table: list[int]


@dataclass(frozen=True)
class StepPlan:
    """One step as plain numbers, for every rank: decodes first."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    rows: list[int]  # rows whose logits are needed
    seqs: list[ScheduledSeq]
    # LoRA: each token row's slot (-1: the base model); None when no row uses an adapter.
    lora_rows: list[int] | None = None
    # (slot, adapter id, name, path) installed on rank 0 since the last plan: the other ranks
    # install each from its path before running this one.
    lora_installs: list[tuple[int, int, str, str]] = field(default_factory=list)
