import pytest

from kvpilot_server import LLM

MiB = 1 << 20


@pytest.fixture
def tiny_llm(tiny_dir) -> LLM:
    """float32: its tests hold sampling to the model's exact distribution (bfloat16 matrices,
    dtype auto on a CPU with AMX, round the random tiny model's logits into exact ties)."""
    return LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB, dtype="float32")
