"""A live `kvpilot serve` on 127.0.0.1 for the API tests, stopped by PID afterwards."""

import pytest

from kvpilot_testing.live_server import start_tiny_server, stop_server


@pytest.fixture(scope="module")
def tiny_server(tiny_dir):
    proc, base = start_tiny_server(tiny_dir("llama"))
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def client(tiny_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0, timeout=60)
