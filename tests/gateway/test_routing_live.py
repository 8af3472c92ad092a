"""Routing through the real gateway to two real replicas (tiny model) on the real control plane.

Affinity: conversations whose turns share their start hit the prefix cache of the replica that
served the earlier turns; measured by the replicas' own counters, prefix-load routing against
round-robin on the same workload shape. Bounded load: a replica that falls behind stops taking
all of its conversations. Faults: a replica killed mid-stream ends that stream with an error
event, and the next requests go to the survivor."""

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvpilot_common import metric_names as names
from kvpilot_gateway.balance import Balancer, prefix_key
from kvpilot_testing.corpus import CORPUS
from kvpilot_testing.kube.cluster import MD
from kvpilot_testing.kube.node import PORT
from tests.gateway.live import pod_metric, spec, wait_ready

WORDS = CORPUS.split()


@pytest.fixture
def live_watched() -> bool:
    """The operator is only what makes the replicas here: the session's serves."""
    return True


def _two_replicas(live, *gateway_args: str):
    live.cluster.create(MD, {"metadata": {"name": "chat"}, "spec": spec(2, autoscaling=False)})
    live.operator()
    gateways = [live.gateway(*args) for args in gateway_args]
    for gateway in gateways:
        wait_ready(gateway, "chat", replicas=2)
    return gateways


def _system_prompt(seed: int) -> str:
    rng = random.Random(seed)
    return f"Conversation {seed}. " + " ".join(rng.choice(WORDS) for _ in range(70))


def _conversations(url: str, seeds: list[int], turns: int) -> None:
    """Each conversation's turns in order, conversations interleaved, as users take turns."""
    history = {s: [{"role": "system", "content": _system_prompt(s)}] for s in seeds}
    with httpx.Client(timeout=60) as http:
        for turn in range(turns):
            for seed in seeds:
                messages = [*history[seed], {"role": "user", "content": f"Question {turn}?"}]
                body = {"model": "chat", "messages": messages, "max_tokens": 6, "temperature": 0}
                answer = http.post(f"{url}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                reply = answer.json()["choices"][0]["message"]["content"]
                history[seed] = [*messages, {"role": "assistant", "content": reply}]


def _hit_ratio(addresses: list[str], run) -> float:
    def counts() -> tuple[float, float]:
        hits = sum(pod_metric(a, names.PREFIX_CACHE_HITS) for a in addresses)
        queries = sum(pod_metric(a, names.PREFIX_CACHE_QUERIES) for a in addresses)
        return hits, queries

    hits, queries = counts()
    run()
    hits_after, queries_after = counts()
    return (hits_after - hits) / (queries_after - queries)


def test_prefix_affinity_reuses_the_cache_that_round_robin_misses(live):
    affinity, round_robin = _two_replicas(live, (), ("--routing", "round-robin"))
    addresses = live.node.addresses()
    # Odd: with an even count round-robin would keep each conversation on one replica by luck.
    with_affinity = _hit_ratio(addresses, lambda: _conversations(affinity.url, [1, 2, 3, 4, 5], 3))
    in_turn = _hit_ratio(addresses, lambda: _conversations(round_robin.url, [6, 7, 8, 9, 10], 3))
    print(json.dumps({"prefix_hit_ratio": {"affinity": with_affinity, "round_robin": in_turn}}))
    assert with_affinity > in_turn + 0.15, (with_affinity, in_turn)
    assert affinity.metric(names.GATEWAY_ROUTING, reason="affinity") == 15
    assert round_robin.metric(names.GATEWAY_ROUTING, reason="round-robin") == 15


def test_a_replica_that_falls_behind_stops_taking_its_conversations(live):
    """Every conversation's own replica is the slow one (it runs one sequence at a time):
    affinity alone would queue them all there; bounded load sends the excess to the other."""
    live.pod_args = lambda n: ("--max-num-seqs", "1") if n == 0 else ()
    (gateway,) = _two_replicas(live, ())
    slow, fast = live.address(0), live.address(1)
    ring = Balancer("prefix-load")
    endpoints = [f"{slow}:{PORT}", f"{fast}:{PORT}"]
    prompts: list[str] = []
    for seed in range(100, 1000):  # about half of them are the slow replica's
        prompt = _system_prompt(seed)[:300]
        owner = ring.pick(endpoints, {}, prefix_key({"prompt": prompt}, 1024)).endpoint
        if owner == endpoints[0]:
            prompts.append(prompt)
        if len(prompts) == 32:
            break
    served = {a: pod_metric(a, names.REQUESTS) for a in (slow, fast)}
    body = {"model": "chat", "max_tokens": 64, "ignore_eos": True, "temperature": 0}
    deadline = time.monotonic() + 120

    def user(i: int) -> int:
        done = 0
        with httpx.Client(timeout=60) as http:
            for prompt in prompts[i::8]:
                if time.monotonic() > deadline:
                    break
                answer = http.post(f"{gateway.url}/v1/completions", json={**body, "prompt": prompt})
                assert answer.status_code == 200, answer.text
                done += 1
        return done

    with ThreadPoolExecutor(8) as pool:
        sent = sum(pool.map(user, range(8)))
    by_replica = {a: pod_metric(a, names.REQUESTS) - served[a] for a in (slow, fast)}
    overflow = gateway.metric(names.GATEWAY_ROUTING, reason="overflow")
    print(json.dumps({"sent": sent, "slow": by_replica[slow], "fast": by_replica[fast]}))
    assert sent == 32
    assert by_replica[fast] >= 8, by_replica  # a quarter or more spilled over
    assert overflow == by_replica[fast]  # and only by overflow: the fast one owns none


def test_a_replica_killed_mid_stream_ends_the_stream_and_the_survivor_serves(live):
    (gateway,) = _two_replicas(live, ())
    body = {
        "model": "chat",
        "prompt": "The river",
        "max_tokens": 240,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    # The gateway's own rule, on idle replicas: which one this conversation goes to.
    addresses = {f"{live.address(n)}:{PORT}": n for n in (0, 1)}
    choice = Balancer("prefix-load").pick(sorted(addresses), {}, prefix_key(body, 1024))
    victim = live.process(addresses[choice.endpoint])
    lines: list[str] = []
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=60) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line and not lines:
                threading.Thread(target=victim.kill).start()  # after the first event
            if line:
                lines.append(line)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    assert "error" in last, lines[-3:]
    assert len(lines) < 240  # cut short, not finished

    survivor = next(a for a in addresses if a != choice.endpoint).split(":")[0]
    before = pod_metric(survivor, names.REQUESTS)
    for i in range(4):
        again = httpx.post(
            f"{gateway.url}/v1/completions",
            json={**body, "stream": False, "max_tokens": 4, "prompt": f"Again {i}"},
            timeout=60,
        )
        assert again.status_code == 200, again.text
    assert pod_metric(survivor, names.REQUESTS) - before == 4
    assert gateway.metric(names.GATEWAY_REQUESTS, outcome="upstream_error") == 1
