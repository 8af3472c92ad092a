"""`kvpilot generate` as a user runs it: a subprocess, JSONL in, JSONL out."""

import json
import os
import subprocess
import sys


def _kvpilot(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvpilot_server.cli", *args],
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


def test_serve_that_cannot_start_says_why_in_the_termination_message(tiny_dir, tmp_path):
    # Kubernetes reads /dev/termination-log; the operator turns it into ModelLoadFailed.
    log = tmp_path / "termination-log"
    log.touch()
    args = ["serve", "--model", str(tiny_dir("llama")), "--quantization", "fp8"]
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot_server.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KVPILOT_TERMINATION_LOG": str(log)},
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert log.read_text().startswith("ModelLoadFailed: fp8 weights need a CUDA GPU")
