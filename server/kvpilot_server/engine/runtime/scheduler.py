"""Continuous batching: which sequences compute how many tokens in the next step.

Each step spends a token budget (max_num_batched_tokens) over at most max_num_seqs sequences.
Running sequences go first (interactive before batch, then by arrival), then waiting ones, each
class's tenants in token-fair order (engine/runtime/fairness.py);
prompts longer than what is left of the budget are prefilled in chunks across steps. When KV
blocks run out, the lowest-priority, latest running sequence is preempted: its blocks are freed
and it is recomputed later (its prefix is often still in the cache). Batch-class work only gets
what interactive work leaves: an interactive request that does not fit evicts running batch work.

Identical prompts admitted together (the n choices of one API request, or clients sharing a
system prompt) would each prefill the whole prompt, since a block only serves from the prefix
cache once it is computed and keyed. So a waiting sequence whose next uncached full block is
being prefilled right now by a running sequence is held back until that block is keyed; then it
computes only what the cache cannot serve (its last, partial block). n choices cost one prefill
plus n-1 partial blocks, and each choice stays an ordinary request: its own seed, sampler
state, abort and preemption, nothing shared but ref-counted cached blocks. vLLM instead forks
one prefilled sequence into n children; that would need one engine request with n outputs, a
copy of the partial block in the KV cache and a sampler fed from one logits row n times, for at
most n-1 partial blocks saved. Without prefix caching nothing is shared, so nothing is held back.

With speculative decoding (engine/runtime/speculative.py) a running sequence that decodes may
get draft tokens for its step: one more position each, within the token budget and the blocks
free now (a draft never preempts anything), and not while more than
speculative_disable_by_batch_size sequences run, where a step is no longer bound by reading
the weights and extra positions cost what they save.

A sequence for a LoRA adapter runs only while its adapter holds one of the engine's slots
(engine/lora/slots.py): it is admitted once the adapter has one, and until then waits, keeping
its place, while sequences behind it go ahead.
"""

import sys
from collections import Counter

from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.lora.slots import LoraSlots
from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.fairness import WaitQueue
from kvpilot_server.engine.runtime.scheduler_output import SchedulerOutput
from kvpilot_server.engine.runtime.sequence import Priority, Sequence, SequenceStatus
from kvpilot_server.engine.runtime.speculative import NgramProposer


class Scheduler:
    def __init__(
        self, config: EngineConfig, pool: BlockPool, lora: LoraSlots | None = None
    ) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.proposer = NgramProposer.of(config)
        self.speculate_up_to = config.speculative_disable_by_batch_size
        self.max_model_len = config.max_model_len or sys.maxsize  # set by the engine
        self.pool = pool
        self.lora = lora
        self.waiting = WaitQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_prefill_tokens = 0  # prompt tokens run through the model (cache hits excluded)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.arrive(seq)

    def num_waiting(self, priority: Priority | None = None) -> int:
        return self.waiting.count(priority)

    def remove(self, seq: Sequence) -> None:
        """Take seq out of the schedule (finished or aborted) and release its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq in self.running:
            self.running.remove(seq)
            self._unpin(seq)
        self.waiting.finished(seq, waiting=seq in self.waiting)
        self.pool.free_seq(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        """Sequences to run this step, each with its number of new tokens."""
        batch: dict[Sequence, int] = {}  # built up here, entries dropped again on preemption
        preempted = self._schedule_running(batch)
        if not preempted:
            self._schedule_waiting(batch)
        # Blocks a preemption just freed are for the preempted to come back to, not for drafts.
        drafts = {} if preempted else self._speculate(batch)
        return SchedulerOutput(batch, drafts)

    def update(self, scheduled: SchedulerOutput, tokens: dict[Sequence, list[int]]) -> None:
        """After the model ran `scheduled`: count the tokens it computed, key the blocks they
        filled for the prefix cache, and append to each sequence the tokens sampled for it
        (`tokens` holds the sequences whose whole context was computed and whose sampling
        succeeded: one token each, or with a draft, the accepted draft tokens and the one
        sampled after them). A rejected draft token's position is not computed: the next step
        writes over its K/V."""
        for seq, n in scheduled.num_new_tokens.items():
            if seq in scheduled.drafts and seq in tokens:
                n = len(tokens[seq])  # its last token and the accepted drafts; not the rejected
            self.num_prefill_tokens += max(
                0, min(n, seq.num_prompt_tokens - seq.num_computed_tokens)
            )
            seq.num_computed_tokens += n
            if seq in tokens:  # first: accepted draft tokens are computed ones, keyed below
                seq.token_ids.extend(tokens[seq])
                self.waiting.sampled(seq, len(tokens[seq]))
            self.pool.commit_full_blocks(seq)

    def _speculate(self, batch: dict[Sequence, int]) -> dict[Sequence, tuple[int, ...]]:
        """Draft tokens for the decoding sequences of this step, each added to its count."""
        if self.proposer is None or len(self.running) > self.speculate_up_to:
            return {}
        drafts = {}
        budget = self._budget(batch)
        for seq, n in batch.items():
            if n != 1 or seq.num_uncomputed_tokens != 1 or not seq.speculate:
                continue
            # Room for the draft and the token after it, within the budget and the context.
            limit = min(
                seq.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - len(seq) - 1,
                budget,
            )
            draft = self.proposer.propose(seq.token_ids, limit)
            if draft and self.pool.can_allocate(seq, 1 + len(draft)):
                self.pool.allocate(seq, 1 + len(draft))
                batch[seq] = 1 + len(draft)
                drafts[seq] = tuple(draft)
                budget -= len(draft)
        return drafts

    def _budget(self, batch: dict[Sequence, int]) -> int:
        return self.max_num_batched_tokens - sum(batch.values())

    def _schedule_running(self, batch: dict[Sequence, int]) -> bool:
        self.running.sort(key=Sequence.sort_key)
        preempted = False
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_uncomputed_tokens, self._budget(batch))
            if n == 0:
                break
            while not self.pool.can_allocate(seq, n):
                preempted = True
                victim = self.running[-1]
                self._preempt(victim, batch)
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                self.pool.allocate(seq, n)
                batch[seq] = n
        return preempted

    def _schedule_waiting(self, batch: dict[Sequence, int]) -> None:
        for priority in Priority:
            held: set[Sequence] = set()  # keep their place: they run as soon as they can
            admitted: set[Sequence] = set()  # in this pass: never preempted by it
            # Each tenant's running sequences of this class, kept up to date below.
            tenants = Counter(s.tenant.name for s in self.running if s.priority is priority)
            while self._budget(batch) > 0:
                seq = self.waiting.next(priority, held, tenants)
                if seq is None:
                    break
                hits = self.pool.match_prefix(seq)
                if self._awaits_prefill(seq, len(hits)):
                    held.add(seq)
                    continue
                n = min(len(seq) - len(hits) * self.pool.block_size, self._budget(batch))
                fits = len(self.running) < self.max_num_seqs and self.pool.can_allocate(
                    seq, n, hits
                )
                if not fits:
                    if priority is Priority.INTERACTIVE and self._evict_batch_work(batch):
                        continue  # a batch sequence: this class's counts are as they were
                    if (victim := self._fair_victim(seq, admitted)) is not None:
                        self._preempt(victim, batch)
                        tenants[victim.tenant.name] -= 1
                        held.add(victim)  # not back in the step that took its slot
                        continue
                    break
                if seq.adapter and not self.lora.acquire(seq.adapter):  # type: ignore[union-attr]
                    held.add(seq)  # every slot is running other adapters
                    continue
                self.waiting.admitted(seq, len(seq) - len(hits) * self.pool.block_size)
                self.pool.count_query(seq, len(hits))
                self.pool.allocate(seq, n, hits)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                tenants[seq.tenant.name] += 1
                admitted.add(seq)
                batch[seq] = n

    def _fair_victim(self, seq: Sequence, admitted: set[Sequence]) -> Sequence | None:
        """A running sequence whose slot seq's tenant may take (fairness.py), unless seq could
        not run anyway: its adapter has no slot to take."""
        if seq.adapter and not self.lora.available(seq.adapter):  # type: ignore[union-attr]
            return None
        return self.waiting.overserved(seq, self.running, exclude=admitted)

    def _awaits_prefill(self, seq: Sequence, num_hit_blocks: int) -> bool:
        """Whether a running sequence is about to compute seq's next full block, which seq would
        otherwise compute again (and which would then serve it from the cache)."""
        if not self.pool.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return False
        end = (num_hit_blocks + 1) * self.pool.block_size  # where the next full block ends
        if end > len(seq) - 1:  # the block holding the last token is never served (match_prefix)
            return False
        head = seq.token_ids[:end]
        return any(
            other.num_computed_tokens < end <= len(other)
            and other.adapter == seq.adapter
            and other.token_ids[:end] == head
            for other in self.running
        )

    def _evict_batch_work(self, batch: dict[Sequence, int]) -> bool:
        victims = [s for s in self.running if s.priority is Priority.BATCH]
        if not victims:
            return False
        self._preempt(max(victims, key=Sequence.sort_key), batch)
        return True

    def _unpin(self, seq: Sequence) -> None:
        if seq.adapter:
            self.lora.release(seq.adapter)  # type: ignore[union-attr]

    def _preempt(self, seq: Sequence, batch: dict[Sequence, int]) -> None:
        self.running.remove(seq)
        self._unpin(seq)
        batch.pop(seq, None)
        self.pool.free_seq(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.requeue(seq)
