"""A tensor-parallel worker:
`python -m kvpilot_server.engine.distributed.worker RANK PORT SETTINGS`.

Started by rank 0 (engine/distributed/workers.py) with the engine settings as JSON, already
resolved (model path, this rank's device, dtype). It builds its share of the model and of the KV
cache, then runs every step rank 0 broadcasts until told to stop. It exits as soon as its stdin
(a pipe from rank 0) closes: rank 0 is gone, and a worker alone would wait in a collective
forever.
"""

import json
import logging
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.distributed.group import join
from kvpilot_server.engine.layers import kv_cache
from kvpilot_server.engine.lora.adapter import LoraAdapter, load_adapter
from kvpilot_server.engine.models.loader import load_hf_config
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_server.engine.models.model_setup import (
    build_model,
    count_blocks,
    cpu_kernel,
    resolve_device,
    resolve_dtype,
)
from kvpilot_server.engine.runtime.model_runner import ModelRunner
from kvpilot_server.engine.runtime.scheduler_output import StepPlan

log = logging.getLogger("kvpilot.tp_worker")


def _exit_with_rank_0() -> None:
    sys.stdin.buffer.read()  # returns at end of file: rank 0's end of the pipe is closed
    log.error("rank 0 is gone; exiting")
    os._exit(1)


def main(argv: list[str]) -> int:
    rank, port = int(argv[0]), int(argv[1])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s rank {rank} %(name)s %(message)s"
    )
    threading.Thread(target=_exit_with_rank_0, name="kvpilot-rank0-watch", daemon=True).start()
    config = EngineConfig(**json.loads(argv[2]))
    assert config.tensor_parallel_size is not None
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if device.type == "cpu":  # the ranks share the machine's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    tp = join(rank, config.tensor_parallel_size, port, device)
    model = build_model(config, Path(config.model), dtype, device, tp)
    blocks = count_blocks(config, model, dtype, device, tp)
    cache = kv_cache.allocate(
        model.cfg, dtype, device, blocks, config.block_size, config.kv_cache_dtype
    )
    max_len = config.max_model_len or model.cfg.max_position_embeddings
    full = ModelConfig.from_hf(load_hf_config(Path(config.model)))

    def read_adapter(name: str, path: str) -> LoraAdapter:
        # Read here, in the step that installs it: rank 0 read and checked it off its loop.
        dense = full.experts is None
        return load_adapter(name, path, full, config.max_lora_rank, dense, tp)

    runner = ModelRunner(
        model,
        cache,
        config.block_size,
        max_len,
        cpu_kernel(device, dtype, model.cfg.head_dim),
        load_adapter=read_adapter,
    )
    log.info("ready: %d KV blocks", blocks)
    while True:
        box: list[StepPlan | None] = [None]
        dist.broadcast_object_list(box, src=0, group=tp.control)
        if box[0] is None:
            break
        runner.execute(box[0], logits=False)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Not sys.exit: the stdin watcher is blocked in a read holding stdin's lock, and the
    # interpreter's shutdown then aborts ("could not acquire lock ... at interpreter shutdown")
    # after a second or more, exiting by SIGABRT from a clean stop.
    logging.shutdown()
    os._exit(code)
