"""`kvpilot generate` as a user runs it: a subprocess, JSONL in, JSONL out."""

import json
import os
import socket
import subprocess
import sys

import pytest


def _kvpilot(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_generate_from_jsonl_writes_one_result_per_line(tiny_dir, tmp_path):
    requests = tmp_path / "in.jsonl"
    requests.write_text(
        json.dumps({"id": "a", "prompt": "The river starts", "max_tokens": 5})
        + "\n\n"
        + json.dumps({"id": "b", "messages": [{"role": "user", "content": "Hi"}]})
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    result = _kvpilot(
        "generate",
        "--input",
        str(requests),
        "--output",
        str(out),
        "--max-tokens",
        "7",
        "--model",
        str(tiny_dir("llama")),
        "--kv-cache-bytes",
        "16MiB",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert [line["usage"]["completion_tokens"] for line in lines] == [5, 7]
    assert all(line["finish_reason"] == "length" and line["text"] for line in lines)


def test_generate_reports_bad_input_clearly(tiny_dir):
    result = _kvpilot(
        "generate",
        "--input",
        "-",
        "--model",
        str(tiny_dir("llama")),
        stdin='{"prompt": "x"}\nnot json\n',
    )
    assert result.returncode == 2 and "line 2: not JSON" in result.stderr
    result = _kvpilot("generate", "hello", "--model", "/no/such/model")
    assert result.returncode == 1 and "does not exist" in result.stderr


def _serve_failure(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "termination-log"
    log.touch()  # Kubernetes provides the file; outside a pod nothing is written
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KVPILOT_TERMINATION_LOG": str(log)},
    )
    return result, log.read_text()


def test_serve_that_cannot_start_says_why_in_the_termination_message(tiny_dir, tmp_path):
    # Kubernetes reads /dev/termination-log; the operator turns it into the condition's reason.
    result, message = _serve_failure(
        tmp_path, "--model", str(tiny_dir("llama")), "--quantization", "fp8"
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert message.startswith("ModelLoadFailed: fp8 weights need a CUDA GPU")


@pytest.mark.parametrize(
    ("keys", "env", "expected"),
    [
        ("", None, "holds no API key"),
        ("# only a comment\n\n", None, "holds no API key"),
        (None, "", "KVPILOT_API_KEYS is set but holds no API key"),
        (None, " , ,", "KVPILOT_API_KEYS is set but holds no API key"),
    ],
    ids=["empty-file", "comments-only", "empty-env", "blank-env"],
)
def test_auth_that_yields_no_key_stops_the_server_before_the_model_loads(
    tmp_path, monkeypatch, keys, env, expected
):
    """Serving without authentication because a Secret was empty would fail open. The model
    path does not exist: the keys are checked first, so that is not what the server reports."""
    args = ["--model", str(tmp_path / "no-such-model")]
    if keys is not None:
        (tmp_path / "keys").write_text(keys)
        args += ["--api-key-file", str(tmp_path / "keys")]
    monkeypatch.delenv("KVPILOT_API_KEYS", raising=False)
    if env is not None:
        monkeypatch.setenv("KVPILOT_API_KEYS", env)
    result, message = _serve_failure(tmp_path, *args)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert message.startswith("InvalidConfiguration: ") and expected in message


def test_serve_on_a_taken_port_says_why(tiny_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        model = ["--model", str(tiny_dir("llama")), "--kv-cache-bytes", "16MiB"]
        result, message = _serve_failure(tmp_path, *model, "--host", "127.0.0.1", "--port", port)
    assert result.returncode == 1
    assert message.startswith(f"StartupFailed: cannot listen on 127.0.0.1:{port}")
