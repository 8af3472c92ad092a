"""The KV cache on a GPU is sized from what the allocator reports free once the weights are in
place (blocks the caching allocator holds for nothing returned first), less a step's workspace,
times the fraction; the workspace is the rule `kvpilot plan` and the operator's fit check count.
The allocator's report is stood in: no GPU here."""

import json

import torch

from kvpilot_common.memory_model import shape_from_config
from kvpilot_common.step_memory import workspace_of
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.distributed.group import SINGLE
from kvpilot_server.engine.layers import kv_cache
from kvpilot_server.engine.models import model_setup
from kvpilot_server.engine.models.loader import load_model

GiB = 1 << 30


def test_the_cache_takes_the_fraction_of_free_memory_a_steps_workspace_leaves(
    tiny_dir, monkeypatch
):
    path = tiny_dir("llama")
    model = load_model(path, torch.float32, torch.device("cpu"))
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    def mem_get_info(device):
        calls.append("mem_get_info")
        return 10 * GiB, 141 * GiB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    cuda = torch.device("cuda")
    config = EngineConfig(
        model=str(path),
        kv_cache_memory_fraction=0.5,
        block_size=16,
        max_num_batched_tokens=4096,
        max_num_seqs=256,
    )
    blocks = model_setup.count_blocks(config, model, torch.bfloat16, cuda, SINGLE)
    per_block = kv_cache.bytes_per_block(model.cfg, torch.bfloat16, cuda, config.block_size)
    workspace = model_setup.workspace(config, model.cfg, torch.bfloat16)
    assert calls == ["empty_cache", "mem_get_info"]  # freed blocks returned before the reading
    assert blocks == int((10 * GiB - workspace) * 0.5) // per_block
    # 256 sequences' float32 sampler rows over the vocabulary are most of it here.
    assert workspace > 256 * model.cfg.vocab_size * 4 * 8
    # The plan's rule from the checkpoint's config gives the engine's figure from its own.
    shape = shape_from_config(json.loads((path / "config.json").read_text()))
    assert workspace_of(shape, "bfloat16", 4096, 256) == workspace
    # Less free memory than a step needs: no cache at all (the start then refuses: too few
    # blocks for one sequence).
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (workspace // 2, 141 * GiB))
    assert model_setup.count_blocks(config, model, torch.bfloat16, cuda, SINGLE) == 0


def test_a_plan_leaves_the_workspace_out_of_the_cache():
    from kvpilot_common.catalogue import KNOWN_MODELS
    from kvpilot_common.memory_model import plan

    shape = KNOWN_MODELS["hf://meta-llama/Llama-3.1-8B-Instruct"]
    workspace = workspace_of(shape, "bfloat16", 2048, 64)
    without = plan(shape, 80 * GiB, 8192, dtype="bfloat16")
    with_it = plan(shape, 80 * GiB, 8192, dtype="bfloat16", workspace_bytes=workspace)
    # Each plan rounds down once: the difference is the workspace's share, to a byte.
    assert abs(without.kv_cache_bytes - with_it.kv_cache_bytes - workspace * 0.9) <= 1
    # A TP rank holds its share of the heads and the MLP, and whole rows of the vocabulary.
    assert workspace_of(shape, "bfloat16", 2048, 64, 2) < workspace
