"""Host tensors on huge pages (engine/huge_pages.py), read back from the kernel's own account
of this process's memory (/proc/self/smaps): the weights and the KV cache of a CPU model."""

from pathlib import Path

import pytest
import torch

from kvpilot_server import LLM
from kvpilot_server.engine import huge_pages

MiB = 1 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str:
    text = THP.read_text() if THP.exists() else "[never]"
    return text.split("[")[1].split("]")[0]


needs_thp = pytest.mark.skipif(
    _thp_mode() == "never", reason="transparent huge pages are off on this host"
)


def _huge_kib(tensor: torch.Tensor) -> int:
    """AnonHugePages of the mappings that hold the tensor's memory (madvise splits a mapping at
    the huge-page boundaries: the tensor's unaligned ends are mappings of their own)."""
    storage = tensor.untyped_storage()
    first, last = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start < last and first < end
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


@needs_thp
def test_a_large_tensor_asked_before_its_first_write_is_on_huge_pages():
    tensor = torch.empty(64 * MiB // 4)
    assert huge_pages.advise(tensor)
    tensor.fill_(1.0)
    assert _huge_kib(tensor) >= 2048  # at least one 2 MiB page


@needs_thp
def test_memory_the_allocator_had_touched_is_on_huge_pages_too():
    # A large tensor may come from a freed chunk of the allocator's heap, its 4 KiB pages
    # already there (this happened in a long test run): written here before the advice, as such
    # memory was before the tensor had it.
    tensor = torch.empty(64 * MiB // 4)
    tensor.fill_(0.0)
    assert huge_pages.advise(tensor)
    tensor.fill_(1.0)
    assert _huge_kib(tensor) >= 2048 and bool((tensor == 1.0).all())


def test_small_and_device_tensors_are_left_alone():
    assert not huge_pages.advise(torch.empty(1000))  # no aligned 2 MiB inside it
    assert not huge_pages.advise(torch.empty(64 * MiB, device="meta"))


def test_placed_parameters_share_one_buffer_and_stay_apart():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(300, 500), torch.nn.Linear(500, 300))
        model.append(torch.nn.Embedding(300, 500))
    model.to_empty(device="cpu")
    model[2].weight = model[1].weight  # tied, as the loader ties: placed once, still one
    huge_pages.place(model)
    params = list(model.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    assert model[2].weight is model[1].weight
    for i, param in enumerate(params):
        assert param.data_ptr() % huge_pages.ALIGN == 0
        param.data.fill_(float(i))
    for i, param in enumerate(params):  # no two overlap
        assert torch.equal(param.data, torch.full_like(param.data, float(i)))


@needs_thp
def test_the_bundled_models_weights_and_kv_cache_are_on_huge_pages(smollm2):
    # A cache of tens of MiB a layer: allocations that large are always fresh mappings.
    llm = LLM(str(smollm2), kv_cache_bytes=2048 * MiB, max_model_len=512, dtype="float32")
    model = llm.engine.model
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1  # weights served as loaded: one buffer
    assert _huge_kib(model.layers[0].mlp.gate_up_proj.weight) >= 2048
    cache = llm.engine.runner.kv_cache[0]
    assert _huge_kib(cache.k) >= 2048
    out = llm.generate([[1, 2, 3]])[0].outputs[0].token_ids
    assert out  # and it serves from them


def test_weights_a_quantization_replaces_are_not_placed(tiny_dir):
    """One buffer would keep each float original alive behind its int8 replacement."""
    llm = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB, quantization="int8")
    storages = {p.untyped_storage().data_ptr() for p in llm.engine.model.parameters()}
    assert len(storages) > 1
