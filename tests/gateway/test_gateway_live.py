"""The gateway as clients and Kubernetes see it, live: API keys, namespace-qualified names,
the official client through it, the upstream request aborted when the client leaves, and a
drain on SIGTERM that lets a stream finish while /ready fails and new requests are refused."""

import json
import time

import httpx
import openai
import pytest
from openai import OpenAI

from kvpilot_common import metric_names as names
from kvpilot_testing.kube.cluster import MD, wait_for
from tests.gateway.live import pod_metric, spec

LONG = {"prompt": "The river", "max_tokens": 240, "ignore_eos": True, "temperature": 0}


def _one_replica(live, *args: str, env: dict | None = None):
    live.cluster.create(MD, {"metadata": {"name": "chat"}, "spec": spec(1, autoscaling=False)})
    live.operator()
    gateway = live.gateway(*args, env=env)

    def ready() -> bool:
        cards = httpx.get(f"{gateway.url}/v1/models", headers=_auth(env), timeout=5).json()
        return any(c["id"] == "chat" and c["ready"] for c in cards["data"])

    wait_for("a ready replica", ready, timeout=120, interval=0.3)
    return gateway


def _auth(env: dict | None) -> dict:
    key = (env or {}).get("KVPILOT_API_KEYS")
    return {"Authorization": f"Bearer {key}"} if key else {}


def test_keys_are_checked_and_a_qualified_name_reaches_the_replica(live):
    gateway = _one_replica(live, env={"KVPILOT_API_KEYS": "gateway-key"})
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{gateway.url}{path}").status_code == 200  # probes stay open
    refused = httpx.get(f"{gateway.url}/v1/models")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{gateway.url}/v1", api_key="wrong", max_retries=0).models.list()
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key="gateway-key", max_retries=0)
    assert [m.id for m in client.models.list()] == ["chat"]
    qualified = f"{live.cluster.ns}/chat"
    answer = client.chat.completions.create(
        model=qualified,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=5,
        temperature=0,
    )
    assert answer.model == "chat"  # the replica answered under its own name
    assert answer.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other-namespace/chat", prompt="x", max_tokens=1)


def test_a_client_that_leaves_aborts_the_upstream_request(live):
    gateway = _one_replica(live)
    (address,) = live.node.addresses()
    before = pod_metric(address, names.REQUESTS)
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json={**LONG, "model": "chat", "stream": True}
    ) as answer:
        assert answer.status_code == 200
        next(answer.iter_lines())  # the first event, then the client hangs up
    start = time.monotonic()

    def aborted() -> bool:
        text = httpx.get(f"http://{address}:8000/metrics").text
        return 'outcome="abort"' in text and pod_metric(address, names.REQUESTS_RUNNING) == 0

    wait_for("the replica to abort the request", aborted, timeout=10, interval=0.05)
    print(json.dumps({"abort_seen_after_s": round(time.monotonic() - start, 3)}))
    assert pod_metric(address, names.REQUESTS) == before + 1
    wait_for(
        "the gateway to count the client as gone",
        lambda: gateway.metric(names.GATEWAY_REQUESTS, outcome="client_closed") == 1,
        timeout=5,
    )


def test_sigterm_drains_a_stream_to_its_end_and_refuses_new_requests(live):
    gateway = _one_replica(live, "--drain-timeout", "60")
    lines: list[str] = []
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/completions",
        json={**LONG, "model": "chat", "stream": True},
        timeout=60,
    ) as answer:
        for line in answer.iter_lines():
            if line and not lines:
                gateway.terminate()
                wait_for(
                    "/ready to fail",
                    lambda: httpx.get(f"{gateway.url}/ready").status_code == 503,
                    timeout=5,
                    interval=0.05,
                )
                refused = httpx.post(
                    f"{gateway.url}/v1/completions", json={"model": "chat", "prompt": "x"}
                )
                assert refused.status_code == 503
            if line:
                lines.append(line)
    assert lines[-1] == "data: [DONE]"
    assert not any('"error"' in line for line in lines)
    assert gateway.process is not None
    assert gateway.process.wait(timeout=20) == 0
