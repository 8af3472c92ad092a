import pytest

from kvpilot_server import LLM

MiB = 1 << 20


@pytest.fixture
def tiny_llm(tiny_dir) -> LLM:
    return LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB)
