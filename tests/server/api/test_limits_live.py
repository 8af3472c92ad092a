"""Per-key limits on a live server, through the official client and plain HTTP: a burst past a
tenant's requests per minute gets 429 with a Retry-After after which the next request succeeds;
tokens per minute are charged from usage; limits change with the key file, without a restart;
a tenant the gateway names is believed only with the gateway secret."""

import time

import httpx
import openai
import pytest

from kvpilot_common import trust

SECRET = "gw-secret-for-tests"
KEYS = "sk-burst name=burst rpm=120\nsk-tokens name=tokens tpm=250\nsk-free-1 name=free\n"


@pytest.fixture(scope="module")
def server(server_pool, tiny_dir, tmp_path_factory):
    """A server of its own: the tests spend its tenants' windows and rewrite its key file."""
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(KEYS)
    flags = ("--api-key-file", str(key_file))
    with server_pool.private_tiny(tiny_dir("llama"), *flags, env={trust.ENV: SECRET}) as live:
        yield live.base, key_file, live.proc


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_burst_past_the_requests_per_minute_waits_exactly_the_retry_after(server):
    base, _, _ = server
    with httpx.Client(base_url=base, headers=_auth("sk-burst")) as http:
        first = http.get("/v1/models")
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "120"
        assert int(first.headers["x-ratelimit-remaining-requests"]) in (118, 119)
        refused = None
        for _ in range(200):  # bounded: 120 in the bucket, 2 a second come back
            answer = http.get("/v1/models")
            if answer.status_code == 429:
                refused = answer
                break
        assert refused is not None
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" and "requests per minute" in error["message"]
        wait_ms = int(refused.headers["retry-after-ms"])
        assert 0 < wait_ms <= 500 and refused.headers["Retry-After"] == "1"
        time.sleep(wait_ms / 1000)
        assert http.get("/v1/models").status_code == 200
    # Another tenant's bucket is its own; the free key has no limit and no limit headers.
    free = httpx.get(f"{base}/v1/models", headers=_auth("sk-free-1"))
    assert free.status_code == 200 and "x-ratelimit-limit-requests" not in free.headers
    metrics = httpx.get(f"{base}/metrics").text
    assert 'kvpilot_rate_limited_total{limit="requests",model="tiny",tenant="burst"}' in metrics


def test_tokens_per_minute_are_charged_from_usage_and_the_debt_waited_out(server):
    base, _, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-tokens", max_retries=0)
    long_prompt = "the quick brown fox jumps over the lazy dog " * 20
    first = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=1)
    spent = first.usage.total_tokens
    assert 150 < spent < 250  # admitted with the bucket full; what is left admits one more
    second = client.completions.create(model="tiny", prompt=long_prompt[:400], max_tokens=1)
    debt = spent + second.usage.total_tokens - 250
    assert debt > 0
    with pytest.raises(openai.RateLimitError, match="tokens per minute") as raised:
        client.completions.create(model="tiny", prompt="x", max_tokens=1)
    headers = raised.value.response.headers
    wait = int(headers["retry-after-ms"]) / 1000
    assert 0 < wait <= debt * 60 / 250 + 0.01  # the debt at 250 a minute, less what came back
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    time.sleep(wait)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=1).choices


def test_a_changed_key_file_applies_without_a_restart(server):
    base, key_file, proc = server
    key_file.write_text(KEYS.replace("sk-free-1 name=free", "sk-new-01 name=new rpm=7"))
    deadline = time.monotonic() + 10
    answer = None
    while time.monotonic() < deadline:  # reread within a second of the change
        answer = httpx.get(f"{base}/v1/models", headers=_auth("sk-new-01"))
        if answer.status_code == 200:
            break
        time.sleep(0.2)
    assert answer is not None and answer.status_code == 200
    assert answer.headers["x-ratelimit-limit-requests"] == "7"
    assert httpx.get(f"{base}/v1/models", headers=_auth("sk-free-1")).status_code == 401
    assert proc.poll() is None


def test_a_tenant_is_believed_only_with_the_gateway_secret(server):
    base, _, _ = server
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
    forged = {**_auth("sk-burst"), trust.TENANT_HEADER: "someone-else"}
    direct = httpx.post(f"{base}/v1/completions", json=body, headers=forged)
    assert direct.status_code == 200 and trust.USAGE_HEADER not in direct.headers
    assert "x-ratelimit-limit-requests" in direct.headers  # limited as its own key
    forwarded = {**forged, trust.HEADER: SECRET}
    via_gateway = httpx.post(f"{base}/v1/completions", json=body, headers=forwarded)
    assert via_gateway.status_code == 200
    assert "x-ratelimit-limit-requests" not in via_gateway.headers  # the gateway limits it
    usage = via_gateway.json()["usage"]["total_tokens"]
    # A gateway without keys names no tenant: the request is its key's, limits and all.
    keyless = {**_auth("sk-burst"), trust.HEADER: SECRET}
    unnamed = httpx.post(f"{base}/v1/completions", json=body, headers=keyless)
    assert unnamed.status_code == 200 and "x-ratelimit-limit-requests" in unnamed.headers
    assert via_gateway.headers[trust.USAGE_HEADER] == str(usage)
    streamed = httpx.post(
        f"{base}/v1/completions", json={**body, "stream": True}, headers=forwarded
    )
    assert f": {trust.USAGE_COMMENT} {usage}\n\ndata: [DONE]" in streamed.text
    direct_stream = httpx.post(
        f"{base}/v1/completions", json={**body, "stream": True}, headers=_auth("sk-new-01")
    )
    assert "[DONE]" in direct_stream.text and trust.USAGE_COMMENT not in direct_stream.text
