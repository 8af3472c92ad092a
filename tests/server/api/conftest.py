"""A live `kvpilot serve` on 127.0.0.1 for the API tests, stopped by PID afterwards."""

import pytest


@pytest.fixture(scope="module")
def client(tiny_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0, timeout=60)
