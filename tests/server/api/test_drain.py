"""SIGTERM while streaming: the stream completes, new requests get 503, /ready fails, exit 0.
Past the drain timeout: a stream ends with an error event, a request not yet answered gets a
503, both in OpenAI's shape."""

import json
import signal

import httpx

from kvpilot_common.http.serving import CUT_MESSAGE
from kvpilot_testing.live_server import start_tiny_server, stop_server
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
