"""A step's integer inputs packed into one buffer and sent in one copy (runtime/staging.py): each
list comes back as the int64 tensor torch.tensor would make of it, step after step, across the
buffer's growth; and a staging that fails its start-up check sends each list alone, as before.
No GPU here: the GPU's way (one device buffer reused every step) runs on the CPU."""

import logging
import random

import pytest
import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.runtime import staging as staging_module
from kvpilot_server.engine.runtime.staging import Staging

CPU = torch.device("cpu")


def _steps(seed: int) -> list[list[list[int]]]:
    """Steps of 4-8 lists each, some empty, some past the first buffer's size."""
    rng = random.Random(seed)
    steps = []
    for _ in range(12):
        sizes = [rng.choice([0, 1, 3, 40, 700, staging_module.INITIAL_SIZE + 5]) for _ in range(8)]
        sizes = sizes[: rng.randint(4, 8)]
        steps.append([[rng.randrange(-(2**40), 2**40) for _ in range(n)] for n in sizes])
    return steps


@pytest.mark.parametrize("one_copy", [False, True])
def test_each_list_arrives_as_torch_tensor_makes_it(one_copy):
    staging = Staging(CPU, one_copy=one_copy)
    for parts in _steps(seed=7):
        sent = staging.send(parts)
        assert len(sent) == len(parts)
        for tensor, part in zip(sent, parts, strict=True):
            expected = torch.tensor(part, dtype=torch.long)
            assert tensor.dtype == torch.long and tensor.device == CPU
            assert tensor.is_contiguous() and torch.equal(tensor, expected)
    assert staging.host.numel() >= staging_module.INITIAL_SIZE * 2  # it grew, and still held


def test_without_one_copy_a_steps_tensors_outlive_the_next_step():
    staging = Staging(CPU)
    first = staging.send([[1, 2, 3], [4]])
    staging.send([[9, 9, 9], [9]])
    assert [t.tolist() for t in first] == [[1, 2, 3], [4]]


def test_the_start_up_check_passes_here_and_a_failing_staging_sends_lists_alone(caplog):
    assert Staging(CPU, one_copy=True).works()
    broken = Staging(CPU, one_copy=True)
    original_send = Staging.send

    def shifted(self, parts):  # a copy that lands each number off by one, say
        sent = original_send(self, parts)
        return [t + 1 for t in sent] if self.packed else sent

    with caplog.at_level(logging.WARNING, logger=staging_module.__name__):
        broken.send = shifted.__get__(broken)  # type: ignore[method-assign]
        assert not broken.works()
    assert "sending each list alone" in caplog.text and "read back" in caplog.text
    assert not broken.packed
    assert [t.tolist() for t in broken.send([[5, 6], [], [7]])] == [[5, 6], [], [7]]


def test_a_staging_whose_copy_raises_is_turned_off(caplog):
    staging = Staging(CPU, one_copy=True)

    def fail(total: int) -> None:
        raise RuntimeError("pinned memory unavailable")

    staging._grow = fail  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger=staging_module.__name__):
        assert not staging.works()
    assert "RuntimeError: pinned memory unavailable" in caplog.text
    assert [t.tolist() for t in staging.send([[1], [2, 3]])] == [[1], [2, 3]]


def test_an_engine_sending_through_one_reused_buffer_gives_the_same_tokens(tiny_dir, corpus_ids):
    # The GPU's way on the CPU: every step's inputs are views of one buffer the next step
    # overwrites, so a tensor kept past its step would change the tokens here.
    prompts = [corpus_ids[i : i + 9 + 23 * i] for i in range(5)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    answers = []
    for one_copy in (False, True):
        llm = LLM(
            str(tiny_dir("llama")),
            kv_cache_bytes=16 << 20,
            dtype="float32",
            max_num_batched_tokens=48,
        )
        llm.engine.runner.staging = Staging(CPU, one_copy=one_copy)
        answers.append([o.outputs[0].token_ids for o in llm.generate(prompts, greedy)])
    assert answers[0] == answers[1] and all(len(a) == 12 for a in answers[0])
