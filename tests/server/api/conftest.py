"""A live `kvpilot serve` on 127.0.0.1 for the API tests, stopped by PID afterwards."""

import pytest


@pytest.fixture(scope="module")
def client(tiny_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def small_server(server_pool, small_vocab_dir):
    """The tiny Llama on the 512-token vocabulary, with room for a tools prompt: one server
    for every module that asks (kvpilot_testing.server_pool): structured outputs, the
    Responses and Messages APIs."""
    with server_pool.tiny(small_vocab_dir("llama"), "--max-model-len", "1024") as server:
        yield server.base


@pytest.fixture(scope="module")
def small_client(small_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{small_server}/v1", api_key="unused", max_retries=0)
