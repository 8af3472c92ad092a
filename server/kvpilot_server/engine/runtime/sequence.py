"""A Sequence is one request's tokens and its place in the KV cache."""

import enum
import itertools
import time
from dataclasses import dataclass, field

from kvpilot_server.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Priority(enum.IntEnum):
    """Lower value runs first: batch work only fills what interactive work leaves."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(frozen=True)
class Tenant:
    """Whose request it is (an API key's name), and its share of the engine when others wait
    too: a tenant of weight 2 gets twice the tokens of one of weight 1 (engine/runtime/fairness.py).
    """

    name: str = ""
    weight: float = 1.0


ANONYMOUS = Tenant()
_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    priority: Priority = Priority.INTERACTIVE
    arrival_time: float = field(default_factory=time.monotonic)
    seq_id: int = field(default_factory=lambda: next(_ids))
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0  # tokens whose K/V sit in the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_keyed_blocks: int = 0  # leading blocks already registered in the prefix cache
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    pooled: bool = False  # an embedding: its prompt's hidden states are pooled, nothing sampled
    adapter: int = 0  # the LoRA adapter's id (engine/lora/slots.py); 0: the base model
    tenant: Tenant = ANONYMOUS
    speculate: bool = False  # may get draft tokens (engine/runtime/speculative.py)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def sort_key(self) -> tuple[int, float, int]:
        """Running order: class first, then arrival. (Which waiting sequence is admitted next
        also weighs its tenant's share: engine/runtime/fairness.py.)"""
        return (self.priority, self.arrival_time, self.seq_id)
