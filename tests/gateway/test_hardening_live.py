"""The gateway attacked as a tenant with nothing but HTTP and a namespace of its own would attack
it, live: the real `kvpilot gateway` on the real control plane, real `kvpilot serve` replicas.
Each test is one finding of the red-team pass that it once fell to: traffic taken by a
served name spelling another namespace, headers and held bodies without bounds, a drain that
did not end, a silent replica holding its client forever, a deleted model's requests waiting
out the hold, bodies that were 500s."""

import http.server
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import httpx
import pytest

from kvpilot_testing import attacks, gateway_attacks
from kvpilot_testing.kube.cluster import MD, PODS, Cluster, create_namespace, wait_for
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.kube.node import PORT, Node, serve_tiny
from kvpilot_testing.raw_http import CLOSED, raw_request
from tests.gateway.live import create_model, create_pod, wait_ready

# "Above idle, whatever the clients send" (docs/limits.md): generous against allocator noise,
# far below what each attack cost before (hundreds of MiB).
RSS_GROWTH_MIB = 100


def test_a_served_name_spelling_another_namespace_cannot_take_its_traffic(live, kube, tiny_dir):
    """The squat: `beta` serves `alpha/llama` before `alpha` serves `llama`. Every request
    for `alpha/llama` reaches alpha's replica; the squatter keeps only its qualified name."""
    victim = live.cluster.ns
    beta = f"beta-{os.getpid()}-{len(victim)}"
    create_namespace(kube.plane, beta)
    attacker = Cluster(kube.plane, beta, kube.operator_kubeconfig)
    # A second Node in the process: its servers' addresses must differ from the first's.
    node = Node(attacker, *serve_tiny(tiny_dir("llama")))
    node.start(interval=0.1)
    try:
        create_model(attacker, "grab", served=f"{victim}/llama", replicas=1)
        grabbed = time.monotonic()
        create_pod(attacker, "grab", f"{victim}/llama")
        gateway = live.gateway("--namespace", beta)
        wait_ready(gateway, f"{victim}/llama")  # the squatter's, while alpha serves nothing
        # Creation times have whole seconds: the victim's is a later one. The squatter's
        # server loading took most or all of that already.
        time.sleep(max(0.0, grabbed + 1.1 - time.monotonic()))
        create_model(live.cluster, "llama", replicas=1)
        create_pod(live.cluster, "llama", "llama")
        wait_ready(gateway, "llama")
        assert not set(node.addresses()) & set(live.node.addresses())
        answered = []
        for _ in range(10):
            body = {"model": f"{victim}/llama", "prompt": "The river", "max_tokens": 1}
            answer = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            answered.append(answer.json()["model"])
        print(json.dumps({"victim_share": answered.count("llama") / len(answered)}))
        assert answered == ["llama"] * 10  # the victim's replica, by its served name
        squat = {"model": f"{beta}/{victim}/llama", "prompt": "x", "max_tokens": 1}
        answer = httpx.post(f"{gateway.url}/v1/completions", json=squat, timeout=60)
        assert answer.json()["model"] == f"{victim}/llama"  # the squatter, under its own name
    finally:
        # Gone before its namespace: an operator watching every namespace (the next test's)
        # must not find a ModelDeployment left in a namespace that is being deleted.
        attacker.delete(MD, "grab")
        attacker.delete(PODS, "grab-0")  # the node, still running, finishes deleting it
        wait_for(
            "the attacker's objects to go", lambda: not attacker.list(MD) + attacker.list(PODS)
        )
        node.stop()
        attacker.close()
        with kube.plane.client() as http:
            http.delete(f"/api/v1/namespaces/{beta}")


def test_headers_are_bounded_in_size_and_time(live):
    gateway = live.gateway("--header-timeout", "1")
    pid = gateway.process.pid
    flood = gateway_attacks.header_flood(gateway.url, pid, clients=6, size=100 << 20)
    print(json.dumps({"header_flood": flood}))
    assert set(flood["statuses"]) <= {431, CLOSED}
    assert max(flood["sent_mib"]) < 4  # cut off near the 64 KiB limit, not after 100 MiB
    assert flood["rss_peak_mib"] - flood["rss_before_mib"] < RSS_GROWTH_MIB
    with ThreadPoolExecutor(3) as pool:  # each waits out the header timeout: side by side
        oversized = pool.submit(attacks.oversized_headers, gateway.url)
        slowly = pool.submit(attacks.slow_clients, gateway.url, 1.0, 1.0)
        idle = attacks.idle_connections(gateway.url, count=20, header_timeout=1.0)
        slow = slowly.result()
    assert set(oversized.result().values()) <= {431, CLOSED}
    assert slow["half_headers"][0] in (408, CLOSED) and slow["half_headers"][1] < 3.5
    assert idle == {"opened": 20, "health_meanwhile": 200, "still_open": 0}


def test_held_bodies_are_bounded_in_bytes_and_keep_only_their_bytes(live):
    create_model(live.cluster, "sleepy")  # at zero, and no operator runs to wake it: held it stays
    # One client address, so one holder: its share is the whole budget here, whose bound this
    # tests (the shares are test_front_door_live.py's).
    gateway = live.gateway("--hold-timeout", "60", "--max-held-bytes-per-tenant", str(32 << 20))
    pid = gateway.process.pid
    size = (4 << 20) - 4096
    held = gateway_attacks.held_bodies(gateway.url, pid, "sleepy", clients=12, size=size, hold=3)
    print(json.dumps({"held_bodies": held}))
    statuses = held["statuses"]
    # 32 MiB for bodies (and a parse's objects) at the default: some of these are held, and
    # the rest are refused at once.
    kept = statuses.count("held")
    assert 4 <= kept <= 7 and statuses.count(429) == 12 - kept, statuses
    assert held["rss_peak_mib"] - held["rss_before_mib"] < RSS_GROWTH_MIB
    wait_for("the holds to end", lambda: gateway.metric("kvpilot_gateway_requests_held") == 0)
    # Named with its namespace, a request's body is the client's with the served name appended,
    # not parsed and written again (which cost twice as much). Eight clients of their own.
    qualified = f"{live.cluster.ns}/sleepy"
    held = gateway_attacks.held_bodies(
        gateway.url, pid, qualified, clients=8, size=size, hold=3, spread=True
    )
    print(json.dumps({"held_qualified_bodies": held}))
    assert held["statuses"].count("held") >= 4, held["statuses"]
    assert held["rss_peak_mib"] - held["rss_before_mib"] < RSS_GROWTH_MIB
    wait_for("the holds to end", lambda: gateway.metric("kvpilot_gateway_requests_held") == 0)
    small = {"model": "sleepy", "prompt": "hi"}
    with ThreadPoolExecutor(1) as pool:  # the budget is free again: a small request is held
        waiting = pool.submit(httpx.post, f"{gateway.url}/v1/completions", json=small, timeout=30)
        wait_for("a hold", lambda: gateway.metric("kvpilot_gateway_requests_held") == 1)
        live.cluster.delete(MD, "sleepy")  # deleted while it waits: 404 at once
        answer = waiting.result()
    assert answer.status_code == 404 and "deleted" in answer.json()["error"]["message"]


def test_bodies_a_replica_would_refuse_are_400_before_routing(live):
    create_model(live.cluster, "sleepy")
    gateway = live.gateway()
    bodies = {
        "deep": b'{"model": "sleepy", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "lone_surrogate": b'{"model": "sleepy", "prompt": "\\ud800"}',
        "nan": b'{"model": "sleepy", "prompt": "x", "temperature": NaN}',
        "not_utf8": b'{"model": "sleepy", "prompt": "\xff"}',
    }
    for name, body in bodies.items():
        answer = httpx.post(
            f"{gateway.url}/v1/completions",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=10,
        )
        assert answer.status_code == 400, (name, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert gateway.metric("kvpilot_gateway_requests_held") == 0  # none was held
    assert "Traceback" not in gateway.log()


def test_sigterm_answers_held_requests_and_exits_at_the_drain_timeout(live):
    create_model(live.cluster, "sleepy")
    gateway = live.gateway("--drain-timeout", "2", "--hold-timeout", "120")
    url = f"{gateway.url}/v1/completions"
    with ThreadPoolExecutor(3) as pool:
        held = [
            pool.submit(httpx.post, url, json={"model": "sleepy", "prompt": "hi"}, timeout=30)
            for _ in range(3)
        ]
        wait_for("three holds", lambda: gateway.metric("kvpilot_gateway_requests_held") == 3)
        dripping = gateway_attacks.dripping_body(gateway.url, seconds=60)  # in flight all along
        start = time.monotonic()
        gateway.terminate()
        answers = [f.result() for f in held]
    answered = time.monotonic() - start
    assert [a.status_code for a in answers] == [503] * 3
    assert all(a.headers["Retry-After"] == "1" for a in answers)
    assert answered < 1.5
    assert gateway.process is not None
    gateway.process.wait(timeout=15)
    exited = time.monotonic() - start
    dripping.close()
    print(json.dumps({"held_answered_s": round(answered, 2), "exited_s": round(exited, 2)}))
    assert exited < 2 + 4  # the drain timeout, then at most the exit grace and the lifespan


def test_a_silent_replica_gets_its_client_a_504_not_a_wait(live):
    create_model(live.cluster, "chat", replicas=1)
    create_pod(live.cluster, "chat", "chat")
    # No second scrape: a stopped replica would be marked down by it, and then held for.
    gateway = live.gateway(
        *("--upstream-timeout", "2", "--upstream-idle-timeout", "2", "--scrape-interval", "600")
    )
    wait_ready(gateway, "chat")
    stream = {"model": "chat", "prompt": "x", "max_tokens": 200, "ignore_eos": True}
    # A fresh replica's first request (its first forward pass: buffers allocated, kernels run
    # once) can take longer on a loaded machine than the 2 s the gateway gives a replica to
    # start answering. Asked directly once, it answers the next at once: what is timed is the
    # gateway's wait on a replica gone silent, not a cold start.
    warm = {**stream, "max_tokens": 1}
    httpx.post(
        f"http://{live.address(0)}:{PORT}/v1/completions", json=warm, timeout=120
    ).raise_for_status()
    url = f"{gateway.url}/v1/completions"

    def silent_request() -> tuple[httpx.Response, float]:
        start = time.monotonic()
        answer = httpx.post(url, json={**stream, "max_tokens": 1}, timeout=30)
        return answer, time.monotonic() - start

    with (
        httpx.stream("POST", url, json={**stream, "stream": True}, timeout=30) as answer,
        ThreadPoolExecutor(1) as pool,
    ):
        lines = answer.iter_lines()
        assert next(lines).startswith("data: ")
        server = live.process(0)
        os.kill(server.pid, signal.SIGSTOP)  # the replica stops mid-stream, its socket open
        try:
            start = time.monotonic()
            # A new request to the silent replica meanwhile: both timeouts run side by side.
            asked = pool.submit(silent_request)
            rest = [line for line in lines if line]
            idle = time.monotonic() - start
            silent, first_byte = asked.result()
        finally:
            os.kill(server.pid, signal.SIGCONT)
    assert '"code": "gateway_timeout"' in rest[-2] and rest[-1] == "data: [DONE]"
    assert 1.5 < idle < 6
    assert silent.status_code == 504, silent.text
    assert 1.5 < first_byte < 6
    assert gateway.metric("kvpilot_gateway_requests_total", outcome="upstream_timeout") == 2


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A stand-in replica that records the headers it gets: what crosses the gateway is the
    question, and the real server does not echo its headers."""

    seen: ClassVar[list] = []

    def do_GET(self) -> None:
        self._answer(b"# nothing\n", "text/plain")

    def do_POST(self) -> None:
        self.seen.append(list(self.headers.items()))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(b'{"model": "chat"}', "application/json")

    def _answer(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Hop", "replica-only")
        self.send_header("Connection", "X-Hop")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_) -> None:
        pass


def test_trailers_connection_headers_and_forwarding_headers_do_not_cross(live):
    """A chunked request whose trailer claims another key, Connection naming a header to
    drop, a forged X-Forwarded-For; a response whose Connection names one of its headers."""

    def serve(address: str, _pod: dict) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer((address, 8000), _Recorder)
        # Polled for shutdown() every 50 ms, not the default 0.5 s the teardown waited out.
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return server

    assert live.node is not None

    def stop(server: http.server.ThreadingHTTPServer) -> None:
        server.shutdown()
        server.server_close()

    # Listening once made: its pod is ready at once, without the tiny server's probe.
    live.node.serve, live.node.stop_server, live.node.ready = serve, stop, None
    create_model(live.cluster, "chat", replicas=1)
    create_pod(live.cluster, "chat", "chat")
    gateway = live.gateway(env={"KVPILOT_API_KEYS": "gateway-key"})
    auth = {"Authorization": "Bearer gateway-key"}
    wait_ready(gateway, "chat", headers=auth)
    body = b'{"model": "chat", "prompt": "x", "max_tokens": 1}'
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer gateway-key\r\nContent-Type: application/json\r\n"
        b"Connection: keep-alive, X-Drop-Me\r\nX-Drop-Me: 1\r\nX-Forwarded-For: 6.6.6.6\r\n"
        b"Forwarded: for=6.6.6.6\r\nTransfer-Encoding: chunked\r\nTrailer: X-Injected\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\nX-Injected: 1\r\nAuthorization: Bearer stolen\r\n\r\n"
    )
    status, _ = raw_request(gateway.url, request, timeout=30)
    assert status == 200
    (seen,) = _Recorder.seen
    names = [k.lower() for k, _ in seen]
    headers = {k.lower(): v for k, v in seen}
    assert "x-injected" not in names and "x-drop-me" not in names and "trailer" not in names
    assert [v for k, v in seen if k.lower() == "authorization"] == ["Bearer gateway-key"]
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["forwarded"] == 'for=127.0.0.1;proto=http;host="127.0.0.1"'
    answer = httpx.post(f"{gateway.url}/v1/completions", content=body, headers=auth, timeout=30)
    assert answer.status_code == 200 and "x-hop" not in answer.headers


def test_the_gateway_refuses_a_bad_reservation_at_start(kube, tmp_path):
    """Refused before it watches anything: the session's control plane, no namespace of its
    own."""
    log = tmp_path / "gateway.log"
    gateway = Gateway(kube.gateway_kubeconfig, "default", log, "--reserve", "meta-llama/*")
    with pytest.raises(RuntimeError, match="PATTERN=NAMESPACE"):
        gateway.start(timeout=30)
