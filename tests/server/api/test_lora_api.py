"""LoRA adapters through the HTTP API, with the official client on a real `kvpilot serve`:
adapters are model names (listed with their base as parent), loaded at start by
--lora-modules or at run time by vLLM's routes (off without the flag, confined to --lora-dir),
unloaded, and counted per adapter in /metrics."""

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from kvpilot_common import adapter_list
from kvpilot_testing.hf_reference import hf_greedy_of
from kvpilot_testing.lora import AdapterSpec, build_adapter, merged_model
from tests.server.api.in_process import serve_in_process

PROMPT = "The capital of France is"
TOKENS = 8


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("lora-dir")
    base = tiny_dir("llama")
    build_adapter(base, root / "attn", AdapterSpec(rank=4, targets=("q_proj", "v_proj"), seed=1))
    build_adapter(base, root / "mlp", AdapterSpec(rank=8, targets=("up_proj", "down_proj"), seed=2))
    outside = tmp_path_factory.mktemp("outside")
    build_adapter(base, outside / "stray", AdapterSpec(rank=2, targets=("o_proj",), seed=3))
    os.symlink(outside / "stray", root / "link-out")
    return root


@pytest.fixture(scope="module")
def lora_list(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lora-list") / "adapters.json"
    path.write_text("[]")
    return path


@pytest.fixture(scope="module")
def server(server_pool, tiny_dir, lora_root, lora_list):
    """A server of its own: the tests load and unload adapters on it."""
    with server_pool.private(
        "--model", str(tiny_dir("llama")), "--served-model-name", "tiny",
        "--kv-cache-bytes", "16MiB", "--max-model-len", "256", "--dtype", "float32",
        "--lora-modules", f"attn={lora_root / 'attn'}",
        "--allow-runtime-lora-updating", "--lora-dir", str(lora_root),
        "--lora-config", str(lora_list),
    ) as live:  # fmt: skip
        yield live.base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


@functools.cache
def _oracle(base, adapter) -> str:
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = tokenizer(PROMPT).input_ids
    return tokenizer.decode(hf_greedy_of(merged_model(base, adapter), ids, TOKENS))


def _complete(client, model: str) -> openai.types.Completion:
    return client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def test_an_adapter_given_at_start_is_a_model_that_answers_as_hf_merges_it(
    client, tiny_dir, lora_root
):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "attn"}
    assert models["attn"].parent == "tiny" and models["attn"].root == "attn"  # not a path
    answer = _complete(client, "attn")
    assert answer.model == "attn"
    assert answer.choices[0].text == _oracle(tiny_dir("llama"), lora_root / "attn")
    assert answer.choices[0].text != _complete(client, "tiny").choices[0].text


def test_load_serve_and_unload_at_run_time(client, server, tiny_dir, lora_root):
    loaded = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": "mlp"}
    )
    assert loaded.status_code == 200, loaded.text
    assert "mlp" in {m.id for m in client.models.list().data}
    chat = client.chat.completions.create(
        model="mlp", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert chat.model == "mlp"
    assert _complete(client, "mlp").choices[0].text == _oracle(tiny_dir("llama"), lora_root / "mlp")
    again = httpx.post(
        f"{server}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": "mlp"}
    )
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    gone = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "mlp"})
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError):
        _complete(client, "mlp")
    assert (
        httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "mlp"}).status_code == 404
    )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"lora_name": "x", "lora_path": "../outside/stray"}, 400, "must lie inside"),
        ({"lora_name": "x", "lora_path": "link-out"}, 400, "must lie inside"),
        ({"lora_name": "x", "lora_path": "missing"}, 400, "adapter_config.json"),
        ({"lora_name": "tiny", "lora_path": "mlp"}, 400, "cannot name an adapter"),
        ({"lora_name": "x y", "lora_path": "mlp"}, 400, "cannot name an adapter"),
        ({"lora_name": "x", "lora_path": "mlp", "extra": 1}, 400, "extra"),
        ({"lora_name": "x", "lora_path": "mlp\x00"}, 400, "NUL byte"),
    ],
)
def test_a_load_outside_the_directory_or_of_no_adapter_is_refused(
    server, client, body, status, message
):
    answer = httpx.post(f"{server}/v1/load_lora_adapter", json=body)
    assert answer.status_code == status, answer.text
    assert message in answer.text
    assert {m.id for m in client.models.list().data} == {"tiny", "attn"}


def test_an_unknown_model_is_404_and_requests_are_counted_per_adapter(client, server):
    with pytest.raises(openai.NotFoundError):
        _complete(client, "nope")
    _complete(client, "attn")
    families = {
        f.name: f for f in text_string_to_metric_families(httpx.get(f"{server}/metrics").text)
    }
    requests = families["kvpilot_lora_requests"].samples
    assert any(s.labels["adapter"] == "attn" and s.value >= 1 for s in requests)
    assert all(s.labels["adapter"] != "tiny" for s in requests)  # the base is not an adapter
    loaded = families["kvpilot_lora_adapter_loaded"].samples
    assert {s.labels["adapter"] for s in loaded} == {"attn"}
    info = families["vllm:lora_requests_info"].samples[0]
    assert info.labels["max_lora"] == "4"
    tokens = families["kvpilot_lora_generation_tokens"].samples
    assert any(s.labels["adapter"] == "attn" and s.value >= TOKENS for s in tokens)


def test_run_time_loading_is_off_without_the_flag(tiny_dir):
    served = serve_in_process(tiny_dir("llama"))
    try:
        answer = httpx.post(
            f"{served.base}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/"}
        )
        assert answer.status_code == 403
        assert "--allow-runtime-lora-updating" in answer.json()["error"]["message"]
    finally:
        served.stop()


def test_a_server_whose_start_adapter_cannot_load_says_so_and_exits(tiny_dir, tmp_path):
    cmd = [
        sys.executable, "-m", "kvpilot_common.cli", "serve", "--model", str(tiny_dir("llama")),
        "--kv-cache-bytes", "16MiB", "--lora-modules", f"bad={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "adapter_config.json" in done.stdout + done.stderr


def _models_become(client, wanted: set[str], timeout: float = 30.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = {m.id for m in client.models.list().data}
        if found == wanted or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_the_adapter_list_file_is_followed_as_it_changes(client, lora_root, lora_list, tiny_dir):
    """What the operator's ConfigMap does to a running pod: entries added are loaded, removed
    ones unloaded, a broken one reported and skipped while the others serve."""
    entry = adapter_list.Entry("listed", "pvc://claim/mlp", str(lora_root / "mlp"))
    broken = adapter_list.Entry("broken", "pvc://claim/none", str(lora_root / "none"))
    lora_list.write_text(adapter_list.encode([entry, broken]))
    assert _models_become(client, {"tiny", "attn", "listed"}) == {"tiny", "attn", "listed"}
    assert _complete(client, "listed").choices[0].text == _oracle(
        tiny_dir("llama"), lora_root / "mlp"
    )
    lora_list.write_text(adapter_list.encode([]))
    assert _models_become(client, {"tiny", "attn"}) == {"tiny", "attn"}  # attn is not the list's
