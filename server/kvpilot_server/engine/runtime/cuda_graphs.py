"""Decode steps replayed from CUDA graphs, one captured per batch size of a ladder.

A decode step of a small model on a GPU is bound by launching its kernels (tens per layer from
Python), not by running them. A graph captured once per batch size replays the whole forward
pass in one launch. What a graph reads lives in static buffers, refilled before each replay:
token ids, positions, cache slots, and the flash path's sequence lengths and block tables
(layers/flash_attention.py; graphs need it: the reference path's shapes change every step).
A step of b sequences replays the smallest captured size that holds b; the rows past b are
padding that writes its K/V into a scratch block no sequence owns and reads one key of it.

Graphs serve only decode-only steps of the base model on one GPU with the flash path on;
everything else (prefill, drafts, LoRA, tensor parallelism) runs eagerly, as does everything
with `enforce_eager`. Before serving, a replay is compared with an eager run of the same step
(`self_test`, on the scratch block): a graph that disagrees or fails is never served.
"""

import logging
from collections.abc import Callable
from typing import Any

import torch

from kvpilot_common.step_memory import graph_sizes as sizes_for
from kvpilot_server.engine.layers.attention import AttentionMetadata
from kvpilot_server.engine.layers.flash_attention import FlashBatch
from kvpilot_server.engine.runtime.scheduler_output import StepPlan

log = logging.getLogger(__name__)


def size_for(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size holding `batch` rows, or None when none does."""
    return next((s for s in sizes if s >= batch), None)


class CudaGraph:
    """torch.cuda.CUDAGraph behind the two verbs DecodeGraphs uses (a stand-in can take them)."""

    def __init__(self, pool: Any) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.cuda.graph(self.graph, pool=self.pool):
            return fn()

    def replay(self) -> None:
        self.graph.replay()


class DecodeGraphs:
    def __init__(
        self,
        runner,
        max_num_seqs: int,
        max_len: int,
        scratch_block: int,
        graph_factory: Callable[[Any], Any] | None = None,
    ) -> None:
        self.runner, self.scratch = runner, scratch_block
        self.sizes = sizes_for(max_num_seqs)
        device, top = runner.device, self.sizes[-1]
        pages = -(-max_len // runner.block_size)
        self.max_len = max_len
        longs, ints = dict(dtype=torch.long, device=device), dict(dtype=torch.int32, device=device)
        self.ids, self.positions = torch.zeros(top, **longs), torch.zeros(top, **longs)
        self.slots, self.rows = torch.zeros(top, **longs), torch.arange(top, **longs)
        self.cu_seq_q = torch.arange(top + 1, **ints)  # one query a sequence
        self.zero = torch.zeros(1, **ints)
        self.seqused = torch.ones(top, **ints)
        self.tables = torch.zeros(top, pages, **ints)
        # The step's numbers are written here on the host, then copied without a sync: pinned
        # memory lets those copies run asynchronously. Written again only after the engine's
        # sampler has read the step's tokens back, so a copy in flight is never overwritten.
        pinned = device.type == "cuda"
        self.host_rows = torch.zeros(4, top, dtype=torch.long, pin_memory=pinned)
        self.host_tables = torch.zeros(top, pages, dtype=torch.int32, pin_memory=pinned)
        # Recorded after the copies: the next step waits for it before rewriting the host side
        # (a step whose outputs are read back has waited already; a pooled one need not have).
        self.copied = torch.cuda.Event() if pinned else None
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        factory = graph_factory or CudaGraph
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory
            graph = factory(pool)
            self._pad(0, size)
            self._forward(size)  # eager once first: lazy initialisations stay out of the graph
            self.graphs[size] = (graph, graph.capture(lambda s=size: self._forward(s)))

    def serves(self, plan: StepPlan) -> bool:
        return (
            plan.lora_rows is None
            and all(seq.n == 1 for seq in plan.seqs)
            and plan.rows == list(range(len(plan.seqs)))
            and size_for(len(plan.seqs), self.sizes) is not None
        )

    def run(self, plan: StepPlan) -> torch.Tensor:
        """The step's logits, [len(plan.seqs), vocab], from the replayed graph."""
        batch = len(plan.seqs)
        size = size_for(batch, self.sizes)
        assert size is not None
        self._fill(plan)
        self._pad(batch, size)
        graph, out = self.graphs[size]
        graph.replay()
        return out[:batch]

    def _fill(self, plan: StepPlan) -> None:
        batch = len(plan.seqs)
        if self.copied is not None:
            self.copied.synchronize()
        rows, tables = self.host_rows.numpy(), self.host_tables.numpy()
        rows[0, :batch] = plan.ids
        rows[1, :batch] = plan.positions
        rows[2, :batch] = plan.slots
        rows[3, :batch] = [seq.computed + 1 for seq in plan.seqs]  # keys, its own included
        tables[:batch] = 0
        for i, seq in enumerate(plan.seqs):
            tables[i, : len(seq.block_table)] = seq.block_table
        for target, source in zip(
            (self.ids, self.positions, self.slots, self.seqused), self.host_rows, strict=True
        ):
            target[:batch].copy_(source[:batch], non_blocking=True)
        self.tables[:batch].copy_(self.host_tables[:batch], non_blocking=True)
        if self.copied is not None:  # on the stream the copies went to: their device's
            self.copied.record(torch.cuda.current_stream(self.ids.device))

    def _pad(self, start: int, size: int) -> None:
        """Rows [start, size): token 0 at position 0, writing slot i of the scratch block and
        attending to its first key."""
        if start >= size:
            return
        block = self.runner.block_size
        rows = torch.arange(start, size, device=self.slots.device)
        self.ids[start:size] = 0
        self.positions[start:size] = 0
        self.slots[start:size] = self.scratch * block + rows % block
        self.seqused[start:size] = 1
        self.tables[start:size] = 0
        self.tables[start:size, 0] = self.scratch

    def _forward(self, size: int) -> torch.Tensor:
        runner = self.runner
        seqused = self.seqused[:size]
        # Inside the graph: the cumulative keys follow the lengths each replay is given.
        cu_k = torch.cat((self.zero, seqused.cumsum(0, dtype=torch.int32)))
        flash = FlashBatch(
            self.cu_seq_q[: size + 1], cu_k, seqused, self.tables[:size], 1, self.max_len
        )

        slots = self.slots[:size]
        metas = {
            w: AttentionMetadata(slot_mapping=slots, window=w, flash=flash) for w in runner.windows
        }
        pos = self.positions[:size]
        logits = runner.model(
            self.ids[:size],
            runner.cos[pos].unsqueeze(1),
            runner.sin[pos].unsqueeze(1),
            runner.kv_cache,
            metas,
            self.rows[:size],
        )
        assert logits is not None
        return logits


def wanted(device: torch.device, enforce_eager: bool) -> bool:
    """Whether to try graphs at all: the engine keeps a scratch block for them then."""
    return device.type == "cuda" and not enforce_eager


def build(runner, max_num_seqs: int, max_len: int, scratch_block: int) -> DecodeGraphs | None:
    """Graphs for this runner's decode steps, or None (said in the log) where they cannot serve
    or their self-test fails."""
    refused = ""
    if not runner.flash:
        refused = "the flash attention path is off"
    elif runner.peers is not None or runner.model.tp.size > 1:
        refused = "tensor parallelism"
    elif runner.model.lora is not None:
        refused = "LoRA adapters"
    elif runner.model.cfg.experts is not None:
        refused = "a mixture of experts routes on the host (its token counts), which no graph holds"
    elif runner.model.pools:
        refused = "an embedding model's steps are prefills"
    graphs = None
    if not refused:
        try:
            with torch.inference_mode():  # as every step runs: no autograd state in a graph
                graphs = DecodeGraphs(runner, max_num_seqs, max_len, scratch_block)
                eager = lambda plan: runner.execute(plan, logits=True, eager=True)  # noqa: E731
                refused = self_test(graphs, eager)
        except Exception as exc:
            refused = f"capture failed: {type(exc).__name__}: {exc}"[:300]
    if refused:
        log.info("CUDA graphs: off (%s); decode steps run eagerly", refused)
        return None
    log.info(
        "CUDA graphs: decode steps of up to %d sequences (sizes %s)", graphs.sizes[-1], graphs.sizes
    )
    return graphs


def self_test(graphs: DecodeGraphs, eager: Callable[[StepPlan], torch.Tensor]) -> str:
    """'' when every graph's replay gives the eager run's logits for a step of its own size;
    else why not. The steps write and read only the scratch block, each row a slot of its own,
    so sizes up to a block's are compared (past that, rows would share slots)."""
    from kvpilot_server.engine.runtime.scheduler_output import ScheduledSeq

    block = graphs.runner.block_size
    for batch in [s for s in graphs.sizes if s <= block] or [block]:
        seqs = [ScheduledSeq(0, 1, 1, [graphs.scratch]) for _ in range(batch)]
        plan = StepPlan(
            ids=[7 + i for i in range(batch)],
            positions=[0] * batch,
            slots=[graphs.scratch * block + i for i in range(batch)],
            rows=list(range(batch)),
            seqs=seqs,
        )
        try:
            want = eager(plan).float().clone()
            got = graphs.run(plan).float()
            error = float((got - want).norm() / want.norm())
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if not error < 0.02:  # NaN included
            return f"the graph of {batch} disagrees with eager (relative error {error:.3g})"
    return ""
