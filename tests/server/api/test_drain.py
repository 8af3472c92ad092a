"""SIGTERM while streaming: the stream completes, new requests get 503, /ready fails, exit 0."""

import json
import signal

import httpx

from kvpilot_testing.live_server import start_tiny_server


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
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.log.close()
