import pytest
from openai import OpenAI


@pytest.fixture(scope="module")
def small_server(server_pool, small_vocab_dir):
    """The tiny Llama on the 512-token vocabulary, with room for a tools prompt: one server
    for every module here (kvpilot_testing.server_pool)."""
    with server_pool.tiny(small_vocab_dir("llama"), "--max-model-len", "1024") as server:
        yield server.base


@pytest.fixture(scope="module")
def small_client(small_server) -> OpenAI:
    return OpenAI(base_url=f"{small_server}/v1", api_key="unused", max_retries=0)
