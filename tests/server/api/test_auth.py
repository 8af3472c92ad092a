"""API keys (Authorization: Bearer, or x-api-key as Anthropic's client sends it): a wrong or
missing key is a 401 in OpenAI's shape; probes and metrics stay open."""

import json
import time

import anthropic
import httpx
import openai
import pytest

from kvpilot_testing.server_pool import LiveServer


@pytest.fixture(scope="module")
def keyed(server_pool, tiny_dir, tmp_path_factory):
    """A server of its own: its key file is this module's."""
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# team keys\nsk-first\nsk-second\n")
    with server_pool.private_tiny(tiny_dir("llama"), "--api-key-file", str(key_file)) as server:
        yield server


@pytest.fixture(scope="module")
def secured(keyed: LiveServer) -> str:
    return keyed.base


def test_right_key_works_and_wrong_key_is_rejected(secured):
    good = openai.OpenAI(base_url=f"{secured}/v1", api_key="sk-second", max_retries=0)
    assert [m.id for m in good.models.list().data] == ["tiny"]
    bad = openai.OpenAI(base_url=f"{secured}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    missing = httpx.post(f"{secured}/v1/completions", json={"prompt": "x"})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


def test_anthropics_client_authenticates_with_x_api_key_or_bearer(secured):
    ask = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    for client in (
        anthropic.Anthropic(base_url=secured, api_key="sk-first", max_retries=0),  # x-api-key
        anthropic.Anthropic(base_url=secured, auth_token="sk-second", max_retries=0),  # Bearer
    ):
        assert client.messages.create(**ask).type == "message"
    bad = anthropic.Anthropic(base_url=secured, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError, match="invalid API key"):
        bad.messages.create(**ask)
    # Two keys that disagree count for nothing, as two Authorization headers do.
    both = {"x-api-key": "sk-first", "Authorization": "Bearer sk-second"}
    assert httpx.get(f"{secured}/v1/models", headers=both).status_code == 401
    agree = {"x-api-key": "sk-first", "Authorization": "Bearer sk-first"}
    assert httpx.get(f"{secured}/v1/models", headers=agree).status_code == 200
    twice = [("x-api-key", "sk-first"), ("x-api-key", "sk-first")]
    assert httpx.get(f"{secured}/v1/models", headers=twice).status_code == 401


def test_probes_and_metrics_need_no_key(secured):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{secured}{path}").status_code == 200


def test_access_log_is_json_without_prompt_or_key(keyed):
    client = openai.OpenAI(base_url=f"{keyed.base}/v1", api_key="sk-first", max_retries=0)
    out = client.completions.create(model="tiny", prompt="secret prompt words", max_tokens=4)
    deadline = time.monotonic() + 5
    records = []
    while time.monotonic() < deadline and not records:
        text = keyed.log_text()
        records = [
            json.loads(line[line.index("{") :])
            for line in text.splitlines()
            if '"event": "request"' in line and out.id in line
        ]
        time.sleep(0.05)
    assert records[0]["status"] == 200 and records[0]["completion_tokens"] == 4
    assert records[0]["outcome"] == "length" and records[0]["ttft_s"] >= 0
    assert "secret prompt" not in text and "sk-first" not in text and "sk-second" not in text


def test_another_tenants_stored_response_is_the_same_404_as_one_never_stored(secured):
    """sk-first and sk-second are two tenants (keys without a name are each their own): the
    second's GET, DELETE and continuation of the first's stored id answer what an id never
    stored answers, in the same words, so ids cannot be probed; the first's id stays its own."""
    owner = openai.OpenAI(base_url=f"{secured}/v1", api_key="sk-first", max_retries=0)
    kept = owner.responses.create(model="tiny", input="x", max_output_tokens=2, store=True)
    other = {"Authorization": "Bearer sk-second"}
    url = f"{secured}/v1/responses"

    def answers(response_id: str) -> list[tuple[int, str]]:
        replies = [
            httpx.get(f"{url}/{response_id}", headers=other),
            httpx.delete(f"{url}/{response_id}", headers=other),
            httpx.post(
                url,
                headers=other,
                json={"input": "x", "max_output_tokens": 2, "previous_response_id": response_id},
            ),
        ]
        return [(r.status_code, r.text.replace(response_id, "<id>")) for r in replies]

    theirs = answers(kept.id)
    assert theirs == answers("resp_" + "0" * 32)
    assert [status for status, _ in theirs] == [404] * 3 and "never stored" in theirs[0][1]
    assert owner.responses.retrieve(kept.id).output_text == kept.output_text
