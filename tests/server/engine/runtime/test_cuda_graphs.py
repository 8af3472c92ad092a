"""CUDA graphs for decode steps, where no GPU is: the graphs are stood in by a capture that reruns
its Python on replay (a CUDA graph replays the same kernels on the same buffers), over the
flash path's stand-in (tests/server/engine/layers/test_flash_path.py), so that what the graphs
add is what is checked: the static buffers each step refills, the ladder of batch sizes, the
padding rows that write only the scratch block, and which steps take a graph."""

from typing import ClassVar

import pytest
import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.runtime import cuda_graphs
from kvpilot_server.engine.runtime.cuda_graphs import size_for, sizes_for
from kvpilot_testing.varlen_standin import varlen_standin

MiB = 1 << 20


class RerunGraph:
    """Capture runs the function once and keeps its output; replay runs it again into that
    output, as a replayed graph writes its captured outputs."""

    captured: ClassVar[list["RerunGraph"]] = []

    def __init__(self, pool) -> None:
        self.replays = 0
        RerunGraph.captured.append(self)

    def capture(self, fn):
        self.fn, self.out = fn, fn()
        return self.out

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(self.fn())


def test_the_ladder_holds_every_batch_up_to_max_num_seqs():
    sizes = sizes_for(40)
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 40]
    assert [size_for(b, sizes) for b in (1, 3, 16, 17, 40)] == [1, 4, 16, 24, 40]
    assert size_for(41, sizes) is None  # more than max_num_seqs: never scheduled, never served


def _llm(path, **settings) -> LLM:
    return LLM(
        str(path),
        kv_cache_bytes=16 * MiB,
        dtype="float32",
        max_num_seqs=6,
        max_num_batched_tokens=64,
        **settings,
    )


def _answers(llm: LLM, corpus_ids) -> list[list[int]]:
    prompts = [corpus_ids[i : i + 10 + 23 * i] for i in range(5)]
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]


@pytest.mark.parametrize("name", ["llama", "mistral-window"])
def test_decode_steps_from_graphs_give_the_eager_tokens(tiny_dir, corpus_ids, monkeypatch, name):
    reference = _answers(_llm(tiny_dir(name)), corpus_ids)
    monkeypatch.setattr(flash_attention, "unusable", lambda *args: "")
    monkeypatch.setattr(flash_attention, "attend", varlen_standin)
    monkeypatch.setattr(cuda_graphs, "wanted", lambda device, eager: not eager)
    monkeypatch.setattr(cuda_graphs, "CudaGraph", RerunGraph)
    RerunGraph.captured = []
    llm = _llm(tiny_dir(name))
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 6]
    scratch = graphs.scratch
    assert scratch == len(llm.engine.pool.blocks)  # the block past the pool's: no sequence's
    before = [c.k[scratch].clone() for c in llm.engine.runner.kv_cache]
    assert _answers(llm, corpus_ids) == reference
    replays = {size: graph.replays for size, (graph, _) in graphs.graphs.items()}
    # The five sequences decode together in a graph of 6 (one padding row) once all are
    # prefilled; the smaller graphs serve the steps while the prefills are staggered.
    assert replays[6] >= 15 and sum(replays.values()) > 15
    # Padding rows wrote the scratch block, and nothing else outside the sequences' blocks.
    assert any(
        not torch.equal(b, c.k[scratch])
        for b, c in zip(before, llm.engine.runner.kv_cache, strict=True)
    )
    eager = _llm(tiny_dir(name), enforce_eager=True)
    assert eager.engine.runner.graphs is None and _answers(eager, corpus_ids) == reference
