import pytest
from openai import OpenAI

from kvpilot_testing.live_server import start_tiny_server, stop_server


@pytest.fixture(scope="module")
def small_server(small_vocab_dir):
    """The tiny Llama on the 512-token vocabulary, with room for a tools prompt."""
    proc, base = start_tiny_server(small_vocab_dir("llama"), "--max-model-len", "1024")
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def small_client(small_server) -> OpenAI:
    return OpenAI(base_url=f"{small_server}/v1", api_key="unused", max_retries=0)
