import anthropic
import pytest


@pytest.fixture(scope="module")
def client(small_server) -> anthropic.Anthropic:
    """Anthropic's client on the API tests' small tiny server (tests/server/api/conftest.py)."""
    return anthropic.Anthropic(base_url=small_server, api_key="unused", max_retries=0, timeout=60)
