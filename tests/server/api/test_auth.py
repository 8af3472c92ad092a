"""API keys: a wrong or missing key is a 401 in OpenAI's shape; probes and metrics stay open."""

import httpx
import openai
import pytest

from tests.server.api.live_server import start_server, stop_server


@pytest.fixture(scope="module")
def secured(tiny_dir, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# team keys\nsk-first\nsk-second\n")
    proc, base = start_server(
        "--model",
        str(tiny_dir("llama")),
        "--served-model-name",
        "tiny",
        "--kv-cache-bytes",
        "16MiB",
        "--max-model-len",
        "256",
        "--api-key-file",
        str(key_file),
    )
    yield base
    stop_server(proc)


def test_right_key_works_and_wrong_key_is_rejected(secured):
    good = openai.OpenAI(base_url=f"{secured}/v1", api_key="sk-second", max_retries=0)
    assert [m.id for m in good.models.list().data] == ["tiny"]
    bad = openai.OpenAI(base_url=f"{secured}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    missing = httpx.post(f"{secured}/v1/completions", json={"prompt": "x"})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


def test_probes_and_metrics_need_no_key(secured):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{secured}{path}").status_code == 200
