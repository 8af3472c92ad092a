"""Scale from zero through the real gateway, on the real control plane: a request for a model
with no replica is held, the operator hears of it from the gateway's annotation and scales the
model up, the test's kubelet starts a real `kvpilot serve`, and the held request is answered.
Bounds: over the hold bound 429 at once; past the hold time 503; nothing left held. A gateway
that dies while holding requests does not lose the model's scale-up."""

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import OpenAI

from kvpilot_common import demand
from kvpilot_testing.kube.cluster import EVENTS, MD, wait_for
from tests.gateway.live import spec

MESSAGES = [{"role": "user", "content": "Tell me about the river."}]
BODY = {"model": "alpha", "prompt": "The river", "max_tokens": 4, "temperature": 0}


def _held(cluster, name: str) -> int:
    md = cluster.get(MD, name) or {}
    return demand.read(md["metadata"].get("annotations"), time.time()).held


def test_a_held_request_wakes_its_model_and_is_answered(live, tiny_server):
    cluster = live.cluster
    cluster.create(MD, {"metadata": {"name": "alpha"}, "spec": spec(0)})
    cluster.create(MD, {"metadata": {"name": "beta"}, "spec": spec(0)})
    live.operator()
    gateway = live.gateway()
    direct = OpenAI(base_url=f"{tiny_server}/v1", api_key="none", max_retries=0)
    expected = direct.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0
    )

    models = httpx.get(f"{gateway.url}/v1/models").json()["data"]
    assert {(m["id"], m["ready"], m["replicas"]) for m in models} == {
        ("alpha", False, 0),
        ("beta", False, 0),
    }
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=180)
    start = time.monotonic()
    stream = client.chat.completions.create(
        model="alpha", messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    first_token, text = None, ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_token = first_token or time.monotonic() - start
            text += chunk.choices[0].delta.content
    assert text == expected.choices[0].message.content  # the woken replica answers correctly
    print(json.dumps({"from_zero_time_to_first_token_s": round(first_token or -1, 2)}))

    assert cluster.get(MD, "alpha")["spec"]["replicas"] == 1
    woke = [
        e
        for e in cluster.list(EVENTS)
        if e["involvedObject"]["name"] == "alpha" and e["reason"] == "ScaledUp"
    ]
    assert woke and "held" in woke[0]["message"], woke
    assert cluster.get(MD, "beta")["spec"]["replicas"] == 0  # nobody asked for it
    assert gateway.metric("kvpilot_gateway_requests_held") == 0
    assert gateway.metric("kvpilot_gateway_hold_seconds_count", model="alpha", outcome="ready") == 1
    # Counted when the gateway's handler ends, which can be just after the client's last byte.
    wait_for(
        "the request counted",
        lambda: gateway.metric("kvpilot_gateway_requests_total", model="alpha", outcome="ok") == 1,
    )
    wait_for("the gateway to report nothing held", lambda: _held(cluster, "alpha") == 0)
    models = {m["id"]: m for m in httpx.get(f"{gateway.url}/v1/models").json()["data"]}
    assert models["alpha"]["ready"] and not models["beta"]["ready"]


def test_holding_is_bounded_in_count_and_time(live):
    """No operator runs: nothing wakes the model, so held requests time out."""
    cluster = live.cluster
    cluster.create(MD, {"metadata": {"name": "alpha"}, "spec": spec(0)})
    cluster.create(MD, {"metadata": {"name": "off"}, "spec": spec(0, autoscaling=False)})
    gateway = live.gateway("--max-held-per-model", "2", "--hold-timeout", "4")
    url = f"{gateway.url}/v1/completions"

    with ThreadPoolExecutor(2) as pool:
        start = time.monotonic()
        held = [pool.submit(httpx.post, url, json=BODY, timeout=30) for _ in range(2)]
        wait_for("two requests held", lambda: gateway.metric("kvpilot_gateway_requests_held") == 2)
        wait_for("the annotation to say 2 held", lambda: _held(cluster, "alpha") == 2)
        before = time.monotonic()
        over = httpx.post(url, json=BODY, timeout=30)
        assert time.monotonic() - before < 1.0  # refused at once, not held
        assert over.status_code == 429, over.text
        assert int(over.headers["Retry-After"]) >= 1
        assert over.json()["error"]["type"] == "rate_limit_error"
        answers = [f.result() for f in held]
    assert time.monotonic() - start >= 4.0
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert "is starting" in answer.json()["error"]["message"]
        assert "Retry-After" in answer.headers
    assert gateway.metric("kvpilot_gateway_requests_held") == 0  # nothing leaks
    assert gateway.metric("kvpilot_gateway_hold_seconds_count", outcome="timeout") == 2
    wait_for("the annotation to say none held", lambda: _held(cluster, "alpha") == 0)

    off = httpx.post(url, json={**BODY, "model": "off"}, timeout=30)  # nothing can start it
    assert off.status_code == 503 and "autoscaling is off" in off.json()["error"]["message"]
    unknown = httpx.post(url, json={**BODY, "model": "nope"}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert cluster.get(MD, "off")["spec"]["replicas"] == 0


def test_a_gateway_killed_while_holding_does_not_lose_the_scale_up(live):
    """The operator is down when the request arrives, and the gateway dies before it is back:
    the annotation the gateway left is the demand, and the operator acts on it."""
    cluster = live.cluster
    cluster.create(MD, {"metadata": {"name": "alpha"}, "spec": spec(0)})
    gateway = live.gateway()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{gateway.url}/v1/completions", json=BODY, timeout=60)
        wait_for("the annotation to say 1 held", lambda: _held(cluster, "alpha") == 1)
        gateway.kill()
        with contextlib.suppress(httpx.HTTPError):  # the connection died with the gateway
            pending.result()
    live.operator()
    wait_for(
        "the operator to scale the model up",
        lambda: cluster.get(MD, "alpha")["spec"]["replicas"] >= 1,
        timeout=30,
    )
    again = live.gateway()
    answer = httpx.post(f"{again.url}/v1/completions", json=BODY, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"]
