"""README's example, as written: the official client asks the bundled model about France."""

import pytest
from openai import OpenAI

from kvpilot_testing.live_server import start_server, stop_server

pytestmark = pytest.mark.slow


def test_readme_example_answers_paris():
    proc, base = start_server("--kv-cache-bytes", "256MiB", "--max-model-len", "2048")
    try:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="builtin://smollm2-135m-instruct",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
    finally:
        stop_server(proc)
