"""Start a real `kvpilot serve` on 127.0.0.1 and stop it by PID."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    *args: str,
    timeout: float = 300.0,
    host: str = "127.0.0.1",
    port: int = 0,
    env: Mapping[str, str] | None = None,
):
    """`kvpilot serve` with `args`, healthy, as (process, base URL); `env` is added to this
    process's environment for it alone."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "kvpilot_common.cli",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        *args,
    ]
    # A file, not a pipe: a chatty server must never block on a full pipe buffer.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop_server
    full_env = {**os.environ, **env} if env else None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=full_env)
    proc.log = log
    base = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"kvpilot serve exited: {log.read()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=1.0).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError("kvpilot serve did not become healthy in time")


def stop_server(proc: subprocess.Popen) -> None:
    terminate(proc)
    proc.log.close()


def stop_servers(procs: Iterable[subprocess.Popen], grace: float = 30.0) -> None:
    """Stop several at once: every SIGTERM is sent before any wait, so they drain and exit
    side by side rather than one after another."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    reap(procs, grace)


def stop_side_by_side(stops: list[Callable[[], None]]) -> None:
    """Stops of several parts (a gateway, a node's servers, an operator) at once: each takes a
    moment to exit, and one after another a teardown waited out each in turn."""
    with ThreadPoolExecutor(max(1, len(stops))) as pool:
        list(pool.map(lambda stop: stop(), stops))  # list(): a stop that raised raises here


def reap(procs: Iterable[subprocess.Popen], grace: float = 30.0) -> None:
    """Wait for servers already sent SIGTERM, SIGKILL for any still there after `grace` s."""
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.log.close()


def terminate(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tiny_flags(model_dir: str | Path, *extra: str, name: str = "tiny") -> tuple[str, ...]:
    """The tiny Llama test model served as `name` with a 256-token context, in float32 (the
    dtype tests hold equal to Hugging Face's), plus extra flags."""
    return (
        "--model",
        str(model_dir),
        f"--served-model-name={name}",
        "--dtype=float32",
        "--kv-cache-bytes",
        "16MiB",
        "--max-model-len",
        "256",
        *extra,
    )


def start_tiny_server(
    model_dir,
    *extra: str,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str = "tiny",
    env: Mapping[str, str] | None = None,
):
    """A private `kvpilot serve` of tiny_flags(model_dir, *extra, name=name)."""
    return start_server(*tiny_flags(model_dir, *extra, name=name), host=host, port=port, env=env)
