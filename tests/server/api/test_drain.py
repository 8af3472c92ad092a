"""SIGTERM while streaming: the stream completes, new requests get 503, /ready fails, exit 0.
Past the drain timeout: a stream ends with an error event, a request not yet answered gets a
503, both in OpenAI's shape. A server that is PID 1, as in a container, stopped while it loads
exits then."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvpilot_common.http.serving import CUT_MESSAGE
from kvpilot_testing.live_server import free_port, start_tiny_server, stop_server, tiny_flags
from kvpilot_testing.raw_http import answer_of, cut_mid_body


def test_sigterm_drains_in_flight_streams(tiny_dir):
    proc, base = start_tiny_server(tiny_dir("llama"))
    body = {
        "model": "tiny",
        "prompt": "The river",
        "max_tokens": 240,
        "ignore_eos": True,
        "stream": True,
    }
    seen: dict[str, object] = {}
    try:
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            # Probe while the stream is still being generated (we have not read it yet).
            seen["ready"] = httpx.get(f"{base}/ready").status_code
            seen["new"] = httpx.post(f"{base}/v1/completions", json={"prompt": "x"})
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        last = json.loads(rest[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        assert seen["ready"] == 503
        assert seen["new"].status_code == 503 and "shutting down" in seen["new"].text
        assert proc.wait(timeout=60) == 0
    finally:
        stop_server(proc)  # a second SIGTERM: exits at once if a failed test left it draining


def test_a_stream_the_drain_timeout_overtakes_ends_with_an_error_event(tiny_dir):
    """--drain-timeout 0: a stream still running at SIGTERM is not cut mid-body; it ends with a
    503 error event in OpenAI's shape that says why, and [DONE]; the server exits 0."""
    proc, base = start_tiny_server(
        tiny_dir("llama"), "--max-model-len", "1024", "--drain-timeout", "0"
    )
    body = {"model": "tiny", "prompt": "The river", "max_tokens": 1000, "ignore_eos": True}
    body["stream"] = True
    try:
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))["error"]
        assert error["code"] == "service_unavailable", error
        assert "drain timeout passed" in error["message"], error
        assert len(rest) < 1000  # ended early, not run to max_tokens
        assert proc.wait(timeout=60) == 0
    finally:
        stop_server(proc)  # a second SIGTERM: exits at once if a failed test left it draining


def test_a_request_the_drain_timeout_overtakes_unanswered_gets_a_json_503(tiny_dir):
    """--drain-timeout 0: a request still reading its body at SIGTERM (out of the engine's
    reach, so nothing ends it before uvicorn cancels it) is answered 503 in OpenAI's shape,
    not with uvicorn's plain-text 500; the server exits 0."""
    proc, base = start_tiny_server(tiny_dir("llama"), "--drain-timeout", "0")
    try:
        raw = cut_mid_body(base, "/v1/completions", lambda: proc.send_signal(signal.SIGTERM))
        status, headers, body = answer_of(raw)
        assert (status, headers["content-type"]) == (503, "application/json"), raw
        assert json.loads(body)["error"] == {
            "message": CUT_MESSAGE,
            "type": "service_unavailable",
            "param": None,
            "code": "service_unavailable",
        }
        assert proc.wait(timeout=60) == 0
    finally:
        stop_server(proc)


def test_a_server_that_is_pid_1_exits_at_a_sigterm_while_it_loads(tiny_dir):
    """In a container the server is PID 1, for which the kernel drops a signal it has no
    handler for: before `kvpilot` caught SIGTERM from its first line, a pod scaled down while it
    loaded its model sat out its whole grace period (310 s in the real-node test). The signal is
    sent as soon as a handler is in, which without ours is uvicorn's, once the model is loaded."""
    serve = [sys.executable, "-m", "kvpilot_common.cli", "serve", "--port", str(free_port())]
    # A PID namespace of its own (we run as root, as the kubelet tests do).
    argv = ["unshare", "--pid", "--fork", "--kill-child", *serve, *tiny_flags(tiny_dir("llama"))]
    with tempfile.TemporaryFile(mode="w+") as log:
        namespace = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            server = _within(30, lambda: _children(namespace.pid))[0]
            _within(60, lambda: _catches(server, signal.SIGTERM))
            os.kill(server, signal.SIGTERM)
            code = namespace.wait(timeout=30)
        finally:
            namespace.kill()
            namespace.wait()
        log.seek(0)
        said = log.read()
    assert code == 128 + signal.SIGTERM, said[-2000:]
    assert "kvpilot: SIGTERM before serving: exiting" in said
    assert "Started server process" not in said  # uvicorn's first line: it never began


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _within(seconds: float, check):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.01)
    raise TimeoutError(f"not within {seconds} s")
