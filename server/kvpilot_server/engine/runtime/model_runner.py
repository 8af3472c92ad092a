"""Runs one scheduled step on the model: flatten the batch, build attention metadata, get logits.

Two halves: run() turns the scheduler's output into a StepPlan of plain numbers and executes it,
execute() turns a plan into tensors on this rank's device and runs the model. Under tensor
parallelism rank 0 plans and every rank executes the same plan (engine/distributed/workers.py
sends it): ranks share the block tables, each holding its own KV heads of every block.
"""

import logging
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn, Protocol

import torch

from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillBatch,
    PrefillChunk,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import KVCache
from kvpilot_server.engine.lora import layers as lora_layers
from kvpilot_server.engine.lora.adapter import LoraAdapter
from kvpilot_server.engine.lora.slots import LoraSlots
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import rope_tables
from kvpilot_server.engine.runtime import flash_check
from kvpilot_server.engine.runtime.cuda_graphs import DecodeGraphs
from kvpilot_server.engine.runtime.scheduler_output import ScheduledSeq, SchedulerOutput, StepPlan
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.engine.runtime.staging import Staging

log = logging.getLogger(__name__)

# (sequence, rows of the logits, position of the prompt token the first row predicts); for an
# embedding (seq.pooled), rows of hidden states and the position of the first row's token.
PromptRows = tuple[Sequence, slice, int]
# (sequence, rows of the logits): a sequence with draft tokens, one row per position it scored.
DraftRows = tuple[Sequence, slice]
_MIN_GROUP_LEN = 64  # contexts shorter than this are cheap: one group holds them all


class Peers(Protocol):
    """The other ranks of a tensor-parallel group, seen from rank 0
    (engine/distributed/workers.py)."""

    def send(self, plan: StepPlan) -> None: ...

    def fail(self, message: str) -> NoReturn: ...


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        block_size: int,
        max_len: int,
        kernel: ModuleType | None = None,
        peers: Peers | None = None,
        lora: LoraSlots | None = None,  # rank 0's slots, when serving adapters
        load_adapter: Callable[[str, str], LoraAdapter] | None = None,  # another rank's
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        # The final norm's weight: the embedding table may be int8 (layers/lm_head_quant.py).
        self.device = model.norm.weight.device
        cos, sin = rope_tables(model.cfg, max_len)
        dtype = model.norm.weight.dtype
        self.cos, self.sin = cos.to(self.device, dtype), sin.to(self.device, dtype)
        self.windows = sorted(set(model.cfg.layer_windows), key=lambda w: w or 0)
        eager = model.cfg.eager_softmax  # the compiled decode kernel has no cap and no sinks
        self.kernel = None if eager else kernel
        self.peers = peers  # tensor parallelism: every plan goes to the other ranks first
        self.lora, self.load_adapter = lora, load_adapter
        self.graphs: DecodeGraphs | None = None  # set by the engine (cuda_graphs.build)
        # The compiled prompt kernel reads a float32 cache only: an int8 one takes PyTorch's.
        self.quantized = quantized = kv_cache[0].k_scale is not None
        refused = flash_attention.unusable(self.device, dtype, quantized, eager, block_size)
        self.flash = not refused
        self.staging = Staging(self.device)
        if self.device.type == "cuda":
            self.staging.works()
        if self.flash:
            refused = flash_attention.self_test(lambda: flash_check.both_attentions(self))
            self.flash = not refused
        if self.device.type == "cuda":
            log.info(
                "attention: %s", "flash (varlen, paged)" if self.flash else f"reference ({refused})"
            )

    @torch.inference_mode()
    def run(
        self, scheduled: SchedulerOutput
    ) -> tuple[torch.Tensor, list[Sequence], list[DraftRows], list[PromptRows]]:
        """Logits for every sequence whose last token is computed in this step, in order, then
        the rows of each sequence with draft tokens (DraftRows), then the rows of prompt tokens
        whose logprobs were asked for, or of embeddings' tokens (see PromptRows)."""
        drafts = scheduled.drafts
        # Decodes first, shortest context first, so that similar lengths share a padded group.
        # A draft's positions are decode queries too: each attends to the keys before it.
        ordered = sorted(
            scheduled.num_new_tokens.items(),
            key=lambda item: (item[1] != 1 and item[0] not in drafts, len(item[0])),
        )
        ids, positions, slots, rows, sampling = [], [], [], [], []
        # (seq, first row, count, position the first row's output is for)
        scored: list[tuple[Sequence, int, int, int]] = []
        drafted: list[tuple[Sequence, int, int]] = []
        for seq, n in ordered:
            start = seq.num_computed_tokens
            first_row = len(ids)
            ids.extend(seq.token_ids[start : start + n])  # with a draft: its last token
            positions.extend(range(start, start + n))
            slots.extend(self._slot(seq, p) for p in range(start, start + n))
            if seq in drafts:
                ids.extend(drafts[seq])
                drafted.append((seq, first_row, n))
                continue
            if seq.pooled:  # every row's hidden state: the pooling is the engine's
                scored.append((seq, first_row, n, start))
                continue
            if start + n == len(seq):
                rows.append(len(ids) - 1)
                sampling.append(seq)
            # The row at position p predicts token p + 1: rows before the prompt's last token.
            count = min(start + n, seq.num_prompt_tokens - 1) - start
            if seq.params.prompt_logprobs is not None and count > 0:
                scored.append((seq, first_row, count, start + 1))
        draft_rows = []  # their logits follow the sampling rows
        for seq, first_row, n in drafted:
            draft_rows.append((seq, slice(len(rows), len(rows) + n)))
            rows.extend(range(first_row, first_row + n))
        prompt_rows = []  # their logits follow those
        for seq, first_row, count, position in scored:
            prompt_rows.append((seq, slice(len(rows), len(rows) + count), position))
            rows.extend(range(first_row, first_row + count))
        lora_rows, installs = None, []
        if self.lora is not None:
            installs = self.lora.take_installs()
            if any(seq.adapter for seq, _ in ordered):
                lora_rows = [
                    self.lora.slot_of(seq.adapter) if seq.adapter else -1  # type: ignore[misc]
                    for seq, n in ordered
                    for _ in range(n)
                ]
        plan = StepPlan(
            ids=ids,
            positions=positions,
            slots=slots,
            rows=rows,
            seqs=[entry for seq, n in ordered for entry in _scheduled(seq, n, seq in drafts)],
            lora_rows=lora_rows,
            lora_installs=installs,
        )
        if self.peers is None:
            logits = self.execute(plan, logits=True)
        else:
            self.peers.send(plan)
            try:
                logits = self.execute(plan, logits=True)
            except Exception as exc:  # the ranks may now be out of step: nothing can recover
                self.peers.fail(f"rank 0 failed inside a step: {exc}")
        assert logits is not None
        return logits, sampling, draft_rows, prompt_rows

    @torch.inference_mode()
    def execute(self, plan: StepPlan, logits: bool, eager: bool = False) -> torch.Tensor | None:
        """Run the model over a plan; logits=False (tensor-parallel workers) stops before the
        vocabulary projection. A decode-only step replays a CUDA graph where one serves
        (runtime/cuda_graphs.py), unless `eager`."""
        if self.graphs is not None and logits and not eager and self.graphs.serves(plan):
            return self.graphs.run(plan)
        parts = [plan.ids, plan.positions, plan.slots, plan.rows if logits else []]
        if self.flash:
            numbers = flash_attention.numbers_of(_entries(plan.seqs))
            parts += numbers.parts
        ids, pos, slots, rows, *flash_parts = self.staging.send(parts)  # one copy to the device
        if self.flash:  # one batch serves every window: the window is the call's argument
            flash = flash_attention.batch_from(numbers, flash_parts)
            metas = {w: AttentionMetadata(slots, window=w, flash=flash) for w in self.windows}
        else:
            metas = {w: self._metadata(plan.seqs, slots, w) for w in self.windows}
        self._set_lora(plan)
        return self.model(
            ids,
            self.cos[pos].unsqueeze(1),
            self.sin[pos].unsqueeze(1),
            self.kv_cache,
            metas,
            rows if logits else None,
        )

    def _set_lora(self, plan: StepPlan) -> None:
        """Install what rank 0 installed (another rank), then tell the wrapped projections which
        slot each row reads in this step."""
        if self.model.lora is None:
            return
        state, wrapped = self.model.lora
        if self.load_adapter is not None:
            for slot, _, name, path in plan.lora_installs:
                lora_layers.install(wrapped, slot, self.load_adapter(name, path))
        rows = plan.lora_rows
        state.batch = None if rows is None else lora_layers.LoraBatch(rows, self.device)

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + (
            position % self.block_size
        )

    def _metadata(
        self, ordered: list[ScheduledSeq], slots: torch.Tensor, window: int | None
    ) -> AttentionMetadata:
        if self.flash:
            flash = self._flash_batch(ordered)
            return AttentionMetadata(slot_mapping=slots, window=window, flash=flash)
        meta = AttentionMetadata(slot_mapping=slots, window=window, kernel=self.kernel)
        decodes = [seq for seq in ordered if seq.n == 1]
        start = 0
        # The kernel reads each sequence's own length: one group, no padding cost.
        groups = [decodes] if self.kernel is not None and decodes else _length_groups(decodes)
        for group in groups:
            meta.decodes.append(self._decode_group(start, group, window))
            start += len(group)
        row, chunks = len(decodes), ordered[len(decodes) :]
        if chunks and self.kernel is not None and not self.quantized:
            entries = [(seq.computed, seq.n, seq.block_table) for seq in chunks]
            meta.prefill_batch = PrefillBatch.of(row, entries, self.block_size)
            return meta
        for seq in chunks:
            n = seq.n
            context = seq.computed + n
            fresh = seq.computed == 0 and (window is None or window >= n)
            blocks = seq.block_table[: -(-context // self.block_size)]
            positions = torch.arange(context - n, context)
            mask = None if fresh else visible_keys(positions, context, window)
            meta.prefills.append(
                PrefillChunk(
                    start=row,
                    end=row + n,
                    block_ids=torch.tensor(blocks, device=self.device),
                    context_len=context,
                    mask=None if mask is None else mask.to(self.device),
                )
            )
            row += n
        return meta

    def _flash_batch(self, ordered: list[ScheduledSeq]) -> flash_attention.FlashBatch:
        return flash_attention.batch_of(_entries(ordered), self.device)

    def _decode_group(
        self, start: int, seqs: list[ScheduledSeq], window: int | None
    ) -> DecodeGroup:
        lens = [seq.computed + 1 for seq in seqs]
        width = -(-max(lens) // self.block_size)
        # Padding points at block 0; the mask hides it.
        ids = [
            b
            for seq in seqs
            for b in seq.block_table[:width] + [0] * (width - len(seq.block_table[:width]))
        ]
        context = torch.tensor(lens)
        mask = None
        if self.kernel is None:
            mask = visible_keys(context - 1, width * self.block_size, window)
            mask = mask[None, :, None, :].to(self.device)
        return DecodeGroup(
            start=start,
            end=start + len(seqs),
            block_ids=torch.tensor(ids, device=self.device),
            blocks=width,
            mask=mask,
            context_lens=context.to(self.device),
        )


def _entries(ordered: list[ScheduledSeq]) -> list[tuple[int, int, list[int]]]:
    return [(seq.computed, seq.n, seq.block_table) for seq in ordered]


def _scheduled(seq: Sequence, n: int, drafted: bool) -> list[ScheduledSeq]:
    """What attention needs of seq: a drafted sequence's positions as that many decodes, each
    with one more key than the one before (the decode kernels read the KV cache in place)."""
    table = list(seq.block_table)
    if not drafted:
        return [ScheduledSeq(seq.num_computed_tokens, n, len(seq), table)]
    return [ScheduledSeq(seq.num_computed_tokens + i, 1, len(seq) + i, table) for i in range(n)]


def _length_groups(seqs: list[ScheduledSeq]) -> list[list[ScheduledSeq]]:
    """Split length-sorted sequences where the length doubles: padding stays under 2x while
    the number of attention calls stays small."""
    groups: list[list[ScheduledSeq]] = []
    for seq in seqs:
        if groups and seq.length <= 2 * max(groups[-1][0].length, _MIN_GROUP_LEN):
            groups[-1].append(seq)
        else:
            groups.append([seq])
    return groups
