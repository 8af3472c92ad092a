"""`kvpilot gateway --backend` without Kubernetes: two real `kvpilot serve` of the tiny model on
loopback behind the real gateway, which has no kubeconfig in its environment. The official
openai client through it: both servers take requests, a server killed (SIGKILL) leaves the other
serving every request (the one sent to the dead one goes to the other before a byte reached the
client), /v1/models says how many are ready, and with none ready the answer is 503 at once with a
Retry-After, not a hold."""

from collections.abc import Iterator

import httpx
import openai
import pytest

from kvpilot_common import metric_names as names
from kvpilot_testing.kube.cluster import wait_for
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.live_server import start_tiny_server, stop_server
from tests.gateway.live import metric_at

CHAT = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def servers(tiny_dir) -> Iterator[list]:
    started = []
    try:
        for _ in range(2):
            started.append(start_tiny_server(tiny_dir("llama")))
        yield started
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                stop_server(proc)
            proc.log.close()  # a killed one's too


def _cards(gateway: Gateway) -> list[tuple]:
    data = httpx.get(f"{gateway.url}/v1/models", timeout=5).json()["data"]
    return [(m["id"], m["owned_by"], m["ready_replicas"], m["scale_from_zero"]) for m in data]


def _chat(client: openai.OpenAI, stream: bool = False) -> str:
    """Greedy: whichever server answers, the text is the same."""
    asked = {"model": "tiny", "messages": CHAT, "max_tokens": 6, "temperature": 0}
    if stream:
        chunks = client.chat.completions.create(**asked, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return client.chat.completions.create(**asked).choices[0].message.content or ""


def _other_apis(gateway: Gateway, client: openai.OpenAI) -> None:
    """The Responses and Messages APIs through the gateway, routed by model. A stored response
    lives on the replica that made it: round-robin sends the continuation to the other one,
    which answers a 404 that says so, never a conversation started over."""
    first = client.responses.create(model="tiny", input="Say hello", max_output_tokens=4)
    assert first.output_text and first.usage.output_tokens == 4
    with pytest.raises(openai.NotFoundError, match="No stored response"):
        client.responses.create(
            model="tiny", input="Again", previous_response_id=first.id, max_output_tokens=4
        )
    body = {"model": "tiny", "max_tokens": 4, "messages": CHAT}
    reply = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30)
    assert reply.status_code == 200 and reply.json()["type"] == "message", reply.text


def test_two_backends_share_requests_and_one_killed_leaves_the_other_serving(servers, tmp_path):
    (first, first_url), (_, second_url) = servers
    backends = f"tiny={first_url},{second_url}"
    gateway = Gateway(None, None, tmp_path / "gateway.log", "--backend", backends)
    gateway.args += ("--routing", "round-robin", "--scrape-interval", "0.2")
    gateway.start()
    try:
        assert _cards(gateway) == [("tiny", "static", 2, False)]
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0)
        expected = _chat(client)
        assert expected and all(_chat(client, stream=i % 2 == 1) == expected for i in range(5))
        # In turn (a server counts a stream once its last byte is out: soon after the client).
        wait_for(
            "3 requests at each backend",
            lambda: [metric_at(u, names.REQUESTS) for u in (first_url, second_url)] == [3, 3],
            timeout=5,
        )
        _other_apis(gateway, client)

        first.kill()
        first.wait()
        # Every request succeeds: one sent to the dead server retries on the other.
        assert all(_chat(client, stream=i % 2 == 1) == expected for i in range(4))
        wait_for("one ready backend", lambda: _cards(gateway) == [("tiny", "static", 1, False)])

        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other", messages=CHAT, max_tokens=2)
        stop_server(servers[1][0])
        wait_for("no ready backend", lambda: _cards(gateway) == [("tiny", "static", 0, False)])
        refused = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "tiny", "messages": CHAT, "max_tokens": 2},
            timeout=10,
        )
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["message"] == "No backend of the model 'tiny' is ready"
        assert gateway.metric(names.GATEWAY_REQUESTS, outcome="unavailable") == 1
    finally:
        gateway.stop()
        print(gateway.log()[-3000:])
