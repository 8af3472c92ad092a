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


@pytest.fixture(scope="module")
def thinking_model(small_vocab_dir, tmp_path_factory):
    """The small tiny Llama with a template that opens the thinking unless `enable_thinking` is
    false, as Qwen3's does: the reasoning model of the structured and Messages tests."""
    import shutil

    target = tmp_path_factory.mktemp("thinking") / "model"
    shutil.copytree(small_vocab_dir("llama"), target)
    template = target / "chat_template.jinja"
    text = template.read_text()
    opening = "{{ '<|im_start|>assistant\n' }}"
    assert opening in text
    thinking = "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}"
    template.write_text(text.replace(opening, opening + thinking))
    return target
