"""Rank 0's side of tensor parallelism: one worker process per other rank, joined to rank 0 in
a torch.distributed group; each step's plan is broadcast to them; and they are supervised.

Why processes, not threads: a rank's model runs its own torch (and on CUDA its own device
context), and a crash in one must be seen as a crash. Supervision both ways:
- a worker that dies (killed, out of memory, a failed step) stops the server within a poll
  interval: a termination message naming the rank, the other workers killed, exit status 1,
  so Kubernetes restarts the pod instead of leaving it hung in a collective (NCCL would wait
  forever);
- rank 0 dying ends every worker: each watches its stdin, a pipe from rank 0 that the kernel
  closes however rank 0 ends (engine/distributed/worker.py), so no orphan keeps holding a GPU.
"""

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from kvpilot_common import termination
from kvpilot_common.errors import ConfigError
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.distributed.group import TensorParallel, join
from kvpilot_server.engine.runtime.scheduler_output import StepPlan

log = logging.getLogger(__name__)
WORKER_MODULE = "kvpilot_server.engine.distributed.worker"
_POLL_S = 0.1  # how often rank 0 looks at its workers
_NAME_WAIT_S = 2.0  # a failed step waits this long to learn which worker died
_STOP_WAIT_S = 10.0  # a worker told to stop gets this long before it is killed


def tensor_parallel_size(config: EngineConfig, device: torch.device) -> int:
    """The size asked for, else every GPU the process sees (on `cuda` or `auto`), else 1."""
    if config.tensor_parallel_size is not None:
        return config.tensor_parallel_size
    if device.type == "cuda" and device.index is None:
        return max(1, torch.cuda.device_count())
    return 1


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU from rank 0's (cuda:0 when unnumbered); CPU for all."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"tensor parallel rank {rank} needs GPU {index}, but {torch.cuda.device_count()} "
            "are visible: lower --tensor-parallel-size or expose more GPUs"
        )
    return torch.device("cuda", index)


class Workers:
    """The worker processes of ranks 1..size-1, and the group they share with rank 0."""

    def __init__(
        self,
        config: EngineConfig,
        size: int,
        path: Path,
        device: torch.device,
        dtype: str,  # resolved (model_setup.dtype_name): every rank builds the same matrices
    ) -> None:
        port = _free_port()
        self.stopping = False
        self.ready = False  # every rank has built its cache and waits for plans
        # Held by the one thread that stops the server: the supervisor and the engine's own
        # thread (a broadcast that failed) can both see a worker die, and a second writer
        # would truncate the termination message while the first ends the process.
        self._failing = threading.Lock()
        self.procs: dict[int, subprocess.Popen] = {}
        for rank in range(1, size):
            settings = dataclasses.replace(
                config,
                model=str(path),  # resolved once, here: ranks never download or convert
                device=str(rank_device(device, rank)),
                dtype=dtype,
                tensor_parallel_size=size,
            )
            command = [sys.executable, "-m", WORKER_MODULE, str(rank), str(port)]
            command.append(json.dumps(dataclasses.asdict(settings)))
            self.procs[rank] = subprocess.Popen(command, stdin=subprocess.PIPE)
        self._watch = threading.Thread(target=self._supervise, name="kvpilot-tp", daemon=True)
        self._watch.start()
        self.tp: TensorParallel = join(0, size, port, rank_device(device, 0))

    def send(self, plan: StepPlan | None) -> None:
        try:
            dist.broadcast_object_list([plan], src=0, group=self.tp.control)
        except Exception as exc:
            self.fail(f"rank 0 could not send a step to the workers: {exc}")

    def fail(self, message: str) -> NoReturn:
        """Stop the whole server: nothing can resume a group whose ranks are out of step. A
        second caller waits for the first to end the process."""
        if not self._failing.acquire(blocking=False):
            threading.Event().wait()
        message = self._dead_worker(_NAME_WAIT_S) or message
        log.critical("tensor parallel group failed: %s", message)
        termination.write(termination.WORKER_FAILED, message)
        self._kill()
        logging.shutdown()
        os._exit(1)

    def close(self) -> None:
        """Stop the workers: told to when they wait for a plan, else killed."""
        if self.stopping:
            return
        self.stopping = True
        if self.ready:
            try:
                dist.broadcast_object_list([None], src=0, group=self.tp.control)
            except Exception:  # a worker already gone is killed below
                log.warning("could not tell the tensor parallel workers to stop")
        deadline = time.monotonic() + _STOP_WAIT_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._kill()
        dist.destroy_process_group()

    def _supervise(self) -> None:
        while not self.stopping:
            found = self._dead_worker(0.0)
            if found is not None and not self.stopping:
                self.fail(found)
            time.sleep(_POLL_S)

    def _dead_worker(self, wait_s: float) -> str | None:
        deadline = time.monotonic() + wait_s
        while True:
            for rank, proc in self.procs.items():
                code = proc.poll()
                if code is not None:
                    how = f"signal {-code}" if code < 0 else f"code {code}"
                    return f"tensor parallel worker rank {rank} (pid {proc.pid}) exited with {how}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def _kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
