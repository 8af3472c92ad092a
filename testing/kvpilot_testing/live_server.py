"""Start a real `kvpilot serve` on 127.0.0.1 and stop it by PID."""

import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str, timeout: float = 300.0, host: str = "127.0.0.1", port: int = 0):
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
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
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


def terminate(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_tiny_server(
    model_dir, *extra: str, host: str = "127.0.0.1", port: int = 0, name: str = "tiny"
):
    """The tiny Llama test model served as `name` with a 256-token context, in float32 (the
    dtype tests hold equal to Hugging Face's), plus extra flags."""
    return start_server(
        "--model",
        str(model_dir),
        f"--served-model-name={name}",
        "--dtype=float32",
        "--kv-cache-bytes",
        "16MiB",
        "--max-model-len",
        "256",
        *extra,
        host=host,
        port=port,
    )
