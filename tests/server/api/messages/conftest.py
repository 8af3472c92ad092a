import anthropic
import pytest


@pytest.fixture(scope="module")
def small_server(server_pool, small_vocab_dir):
    """The structured tests' server (the pool shares it: same arguments): the tiny Llama on the
    512-token vocabulary, with room for a tools prompt."""
    with server_pool.tiny(small_vocab_dir("llama"), "--max-model-len", "1024") as server:
        yield server.base


@pytest.fixture(scope="module")
def client(small_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=small_server, api_key="unused", max_retries=0, timeout=60)
