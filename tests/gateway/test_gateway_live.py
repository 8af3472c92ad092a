"""The gateway as clients and Kubernetes see it, live: API keys, namespace-qualified names,
the official client through it, the upstream request aborted when the client leaves, and a
drain on SIGTERM that lets a stream finish while /ready fails and new requests are refused, and
answers a request its timeout overtakes with a 503 in OpenAI's shape."""

import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from kvpilot_common import metric_names as names
from kvpilot_common.http.serving import CUT_MESSAGE
from kvpilot_testing.adversary import is_idle, wait_idle
from kvpilot_testing.kube.cluster import MD, wait_for
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.node import PORT
from kvpilot_testing.raw_http import answer_of, cut_mid_body
from tests.gateway.live import Live, live_of_test, pod_metric, spec, wait_ready

LONG = {"prompt": "The river", "max_tokens": 240, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def replica(module_live: Live) -> Live:
    """One replica of `chat`, made by the session's operator, for the whole module: each test
    asks it through a gateway of its own, and leaves it idle and serving (reads its counters'
    change, never their values), so its start (seconds of loading) is paid once."""
    body = {"metadata": {"name": "chat"}, "spec": spec(1, autoscaling=False)}
    module_live.cluster.create(MD, body)
    return module_live


@pytest.fixture
def live(replica: Live) -> Iterator[Live]:
    """The module's replica, idle before each test (a stream a failed test left must not count
    in the next); the test's gateways stop after it."""
    for address in replica.node.addresses() if replica.node is not None else ():
        gauges = wait_idle(f"http://{address}:{PORT}")
        assert is_idle(gauges, missing_ok=True), gauges
    yield from live_of_test(replica)


def _one_replica(live, *args: str, env: dict | None = None):
    gateway = live.gateway(*args, env=env)
    wait_ready(gateway, "chat", headers=_auth(env))
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
    _structured_requests_pass_unchanged(client)


def _structured_requests_pass_unchanged(client: OpenAI) -> None:
    """Constraints and tools reach the replica as sent, and their answers come back whole."""
    schema = {
        "type": "object",
        "properties": {"capital": {"enum": ["Paris", "Rome"]}, "sure": {"type": "boolean"}},
        "required": ["capital", "sure"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "The capital of France, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        max_tokens=80,
        temperature=0,
    )
    # A random model may spell the JSON a character per token: only a finished one is whole.
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
    # Small: the tools prompt must fit the replica's 256-token context.
    parameters = {"type": "object", "properties": {"c": {"enum": ["P", "R"]}}, "required": ["c"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    kwargs = {
        "model": "chat",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 32,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kwargs).choices[0]
    call = whole.message.tool_calls[0]
    if whole.finish_reason == "tool_calls":
        jsonschema.validate(json.loads(call.function.arguments), parameters)
    streamed = ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed += delta.function.arguments or "" if delta.function else ""
    assert streamed == call.function.arguments
    with pytest.raises(openai.BadRequestError, match="guided_regex"):
        client.chat.completions.create(**kwargs, extra_body={"guided_regex": "(a"})
    # Routed like the others: the replica itself answers that it generates text.
    with pytest.raises(openai.BadRequestError, match="generates text"):
        client.embeddings.create(model="chat", input="x")


def test_a_client_that_leaves_aborts_the_upstream_request(live):
    gateway = _one_replica(live)
    (address,) = live.node.addresses()
    before = pod_metric(address, names.REQUESTS)
    aborts = pod_metric(address, names.REQUESTS, outcome="abort")
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json={**LONG, "model": "chat", "stream": True}
    ) as answer:
        assert answer.status_code == 200
        next(answer.iter_lines())  # the first event, then the client hangs up
    start = time.monotonic()

    def aborted() -> bool:
        return (
            pod_metric(address, names.REQUESTS, outcome="abort") == aborts + 1
            and pod_metric(address, names.REQUESTS_RUNNING) == 0
        )

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


def test_a_request_the_drain_timeout_overtakes_unanswered_gets_a_json_503(tmp_path):
    """--drain-timeout 0: a request still reading its body at SIGTERM is answered 503 in
    OpenAI's shape, not with uvicorn's plain-text 500 (a request waiting on a slow replica's
    answer is cut the same way); the gateway exits 0. No replica is needed for that: a
    --backend where nothing listens, no Kubernetes."""
    backend = "tiny=http://127.0.0.254:8000"  # nothing listens there: the body is never routed
    gateway = Gateway(None, None, tmp_path / "gateway.log", "--backend", backend)
    gateway.args += ("--drain-timeout", "0")
    gateway.start()
    try:
        raw = cut_mid_body(gateway.url, "/v1/completions", gateway.terminate)
        status, headers, body = answer_of(raw)
        assert (status, headers["content-type"]) == (503, "application/json"), raw
        assert json.loads(body)["error"]["message"] == CUT_MESSAGE
        assert json.loads(body)["error"]["code"] == "service_unavailable"
        assert gateway.process is not None
        assert gateway.process.wait(timeout=20) == 0
    finally:
        gateway.stop()
