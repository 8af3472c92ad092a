"""A tensor-parallel `kvpilot serve` is supervised both ways: a worker that dies mid-stream stops
the server within seconds, non-zero, with a termination message naming the rank; a server that
dies takes its workers with it. Real processes, real signals."""

import os
import signal
import time
from pathlib import Path

import httpx

from kvpilot_testing.live_server import start_tiny_server

_DEADLINE_S = 10.0
_BODY = {"model": "tiny", "prompt": "The river", "max_tokens": 200, "ignore_eos": True}


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _worker(proc) -> int:
    (worker,) = _children(proc.pid)
    return worker


def test_a_worker_killed_mid_stream_stops_the_server_naming_its_rank(
    tiny_dir, tmp_path, monkeypatch
):
    log = tmp_path / "termination-log"
    log.touch()  # Kubernetes provides the file
    monkeypatch.setenv("KVPILOT_TERMINATION_LOG", str(log))
    proc, base = start_tiny_server(tiny_dir("llama"), "--tensor-parallel-size", "2")
    try:
        worker = _worker(proc)
        with httpx.stream(
            "POST", f"{base}/v1/completions", json={**_BODY, "stream": True}, timeout=60
        ) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            os.kill(worker, signal.SIGKILL)
            killed = time.monotonic()
            code = proc.wait(timeout=_DEADLINE_S)
        assert time.monotonic() - killed < _DEADLINE_S
        assert code != 0
        assert log.read_text().startswith(
            f"WorkerFailed: tensor parallel worker rank 1 (pid {worker}) exited with signal 9"
        )
        assert not _alive(worker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.log.close()


def test_a_killed_server_leaves_no_worker_behind(tiny_dir):
    proc, base = start_tiny_server(tiny_dir("llama"), "--tensor-parallel-size", "2")
    try:
        worker = _worker(proc)
        reply = httpx.post(f"{base}/v1/completions", json={**_BODY, "max_tokens": 5}, timeout=60)
        assert reply.status_code == 200
        proc.kill()
        proc.wait()
        assert _wait_gone(worker), "the worker outlived the server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.log.close()
