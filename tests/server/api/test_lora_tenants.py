"""LoRA adapters loaded at run time between tenants, on a real `kvpilot serve` with API keys:
each attack a tenant could make on another's adapters (unload it, load over its name, crowd
the server with copies), and what a request may not make the server do or say (a 500 from a
NUL byte, the machine's paths in /v1/models). The server without keys is test_lora_api.py's."""

import argparse
from pathlib import Path

import httpx
import pytest

from kvpilot_common import adapter_list
from kvpilot_common.errors import AdapterError
from kvpilot_server.api.adapters import parse_modules
from kvpilot_server.commands import add_serve_args
from kvpilot_testing.kube.cluster import wait_for
from kvpilot_testing.lora import AdapterSpec, build_adapter

ADMIN, A1, A2, B1 = "sk-operator-admin", "sk-tenant-a-1", "sk-tenant-a-2", "sk-tenant-b-1"
KEYS = f"""# the operator's key, and two tenants'
{ADMIN} name=ops adapters=all
{A1} name=team-a adapters=own
{A2} name=team-a
{B1} name=team-b adapters=own
"""
MAX_LOADED, PER_TENANT = 3, 2


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory, tiny_dir) -> Path:
    root = tmp_path_factory.mktemp("tenant-lora-dir")
    build_adapter(tiny_dir("llama"), root / "attn", AdapterSpec(rank=2, targets=("q_proj",)))
    return root


@pytest.fixture(scope="module")
def adapter_list_file(tmp_path_factory) -> Path:
    """The operator's list (its ConfigMap), empty to begin with."""
    path = tmp_path_factory.mktemp("tenant-list") / "adapters.json"
    path.write_text(adapter_list.encode([]))
    return path


@pytest.fixture(scope="module")
def server(server_pool, tiny_dir, lora_dir, adapter_list_file, tmp_path_factory):
    """A server of its own: the tests load and unload adapters on it."""
    key_file = tmp_path_factory.mktemp("tenant-keys") / "keys.txt"
    key_file.write_text(KEYS)
    with server_pool.private_tiny(
        tiny_dir("llama"), "--api-key-file", str(key_file), "--lora-config", str(adapter_list_file),
        "--lora-modules", f"op-first={lora_dir / 'attn'}", f"op-spare={lora_dir / 'attn'}",
        "--lora-modules", f"op-second={lora_dir / 'attn'}",  # repeated: both are served
        "--allow-runtime-lora-updating", "--lora-dir", str(lora_dir),
        "--max-loaded-adapters", str(MAX_LOADED), "--max-adapters-per-tenant", str(PER_TENANT),
    ) as live:  # fmt: skip
        yield live.base


def _post(server: str, route: str, key: str, **body) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{server}/v1/{route}_lora_adapter", json=body, headers=headers, timeout=60)


def _load(server: str, key: str, name: str) -> httpx.Response:
    return _post(server, "load", key, lora_name=name, lora_path="attn")


def _unload(server: str, key: str, name: str) -> httpx.Response:
    return _post(server, "unload", key, lora_name=name)


def _models(server: str) -> dict[str, dict]:
    listed = httpx.get(f"{server}/v1/models", headers={"Authorization": f"Bearer {A2}"}, timeout=60)
    return {card["id"]: card for card in listed.json()["data"]}


def _refused(answer: httpx.Response, status: int, words: str) -> bool:
    error = answer.json()["error"]
    return answer.status_code == status and words in error["message"] and "type" in error


def test_another_tenant_can_neither_unload_an_adapter_nor_load_over_its_name(server):
    assert _load(server, A1, "a-tone").status_code == 200
    try:
        assert _refused(_unload(server, B1, "a-tone"), 403, "another tenant")
        assert _refused(_load(server, B1, "a-tone"), 403, "another tenant")
        assert _refused(_unload(server, A2, "a-tone"), 403, "adapters=own")  # no say over them
        body = {"model": "a-tone", "prompt": "hi", "max_tokens": 2}
        headers = {"Authorization": f"Bearer {A2}"}  # a-tone still serves its tenant
        answer = httpx.post(f"{server}/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200
        assert _refused(_load(server, A2, "a-other"), 403, "adapters=own")
    finally:
        assert _unload(server, A1, "a-tone").status_code == 200  # its owner may


def test_only_a_key_with_adapters_all_unloads_what_the_operator_or_others_loaded(server):
    assert _refused(_unload(server, A1, "op-spare"), 403, "the operator")
    assert _refused(_load(server, A1, "op-spare"), 403, "the operator")
    assert _load(server, B1, "b-tone").status_code == 200
    assert _unload(server, ADMIN, "b-tone").status_code == 200
    assert _unload(server, ADMIN, "op-spare").status_code == 200
    assert "op-spare" not in _models(server)
    # Unloaded, the name is still the operator's: no tenant serves its weights under it.
    assert _refused(_load(server, A1, "op-spare"), 403, "the operator declares")
    assert _refused(_load(server, ADMIN, "op-spare"), 403, "the operator declares")


def test_run_time_adapters_are_capped_per_tenant_and_in_all(server):
    """The attack: one key loading the same adapter under hundreds of names."""
    loaded = []
    try:
        for name in ("a-1", "a-2"):
            assert _load(server, A1, name).status_code == 200
            loaded.append((A1, name))
        assert _refused(_load(server, A1, "a-3"), 400, f"{PER_TENANT} per tenant")
        assert _load(server, B1, "b-1").status_code == 200
        loaded.append((B1, "b-1"))
        assert _refused(_load(server, B1, "b-2"), 400, f"{MAX_LOADED} adapters")
    finally:
        for key, name in loaded:
            assert _unload(server, key, name).status_code == 200
    assert _load(server, B1, "b-2").status_code == 200  # an unload makes room again
    assert _unload(server, B1, "b-2").status_code == 200


@pytest.mark.parametrize(
    ("path", "words"),
    [(b"attn\\u0000", "NUL"), (b"a\\u0000/../attn", "NUL")],
)
def test_a_path_no_file_can_have_is_a_400_not_a_500(server, path, words):
    body = b'{"lora_name": "odd", "lora_path": "' + path + b'"}'
    answer = httpx.post(
        f"{server}/v1/load_lora_adapter",
        content=body,
        headers={"Authorization": f"Bearer {A1}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert _refused(answer, 400, words), answer.text


def test_models_show_no_path_of_the_machine_and_repeated_lora_modules_all_load(server, lora_dir):
    assert _load(server, A1, "a-listed").status_code == 200
    try:
        cards = _models(server)
        assert {"op-first", "op-second", "a-listed"} <= set(cards)
        adapters = [card for card in cards.values() if card.get("parent")]
        assert all(card["root"] == card["id"] for card in adapters), adapters
        assert str(lora_dir) not in str(cards)
    finally:
        assert _unload(server, A1, "a-listed").status_code == 200


def test_lora_modules_given_twice_add_up_and_a_name_twice_is_refused():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(["--lora-modules", "a=/x", "b=/y", "--lora-modules", "c=/z"])
    assert parse_modules(args.lora_modules) == {"a": "/x", "b": "/y", "c": "/z"}
    twice = parser.parse_args(["--lora-modules", "a=/x", "--lora-modules", "a=/y"])
    with pytest.raises(AdapterError, match="names 'a' twice"):
        parse_modules(twice.lora_modules)


def test_a_name_the_operators_list_declares_is_taken_back_from_a_tenant(
    server, lora_dir, adapter_list_file
):
    """A tenant that loaded a name before the operator's list declared it (or while the list's
    entry downloaded) does not keep it: the list's sync unloads the tenant's and serves its own,
    and no tenant loads under the name after."""
    assert _load(server, A1, "late").status_code == 200
    entry = adapter_list.Entry("late", "pvc://claim/attn", str(lora_dir / "attn"))
    adapter_list_file.write_text(adapter_list.encode([entry]))
    try:
        # Asked by a tenant that may unload nothing of others': whose it is, changing nothing.
        wait_for(
            "the list to take its name back",
            lambda: _refused(_unload(server, B1, "late"), 403, "loaded by the operator"),
            timeout=30,
            interval=0.5,
        )
        assert _refused(_unload(server, A1, "late"), 403, "loaded by the operator")
        assert _refused(_load(server, B1, "late"), 403, "the operator declares")
        assert "late" in _models(server)
    finally:
        adapter_list_file.write_text(adapter_list.encode([]))
