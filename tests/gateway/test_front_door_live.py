"""What a tenant sends the gateway cannot deny another tenant its service: the memory for
request bodies cannot be taken by one tenant (budget.py), nor held by a body that comes a byte
at a time (kvpilot_common/http/body.py), and what the gateway accepts its replica accepts too
(headers.py). The real `kvpilot gateway` in front of a real `kvpilot serve`, its --backend,
attacked over raw sockets where no client library would send the request."""

import json
from collections.abc import Iterator

import httpx
import pytest

from kvpilot_testing import gateway_attacks
from kvpilot_testing.kube.gateway import Gateway

ATTACKERS = ["sk-attacker-one-0001", "sk-attacker-two-0002"]
VICTIM = "sk-victim-key-0003"


@pytest.fixture(scope="module")
def gateway(tiny_server, tmp_path_factory) -> Iterator[Gateway]:
    keys = ",".join(f"{k} name={k[3:-5]}" for k in [*ATTACKERS, VICTIM])
    log = tmp_path_factory.mktemp("budget") / "gateway.log"
    started = Gateway(
        None,
        None,
        log,
        *("--backend", f"tiny={tiny_server}", "--body-timeout", "3"),
        env={"KVPILOT_API_KEYS": keys},
    ).start()
    yield started
    started.stop()
    print(started.log()[-3000:])


def test_two_tenants_dripping_bodies_cannot_starve_a_third(gateway):
    """Four connections of each attacker's key would fill the whole budget (32 MiB) with
    bodies that never end; each tenant holds its share (8 MiB) at most, and the victim's
    chat is answered every time."""
    attack = gateway_attacks.starved_victim(
        gateway.url, "tiny", ATTACKERS, VICTIM, per_key=4, tries=3
    )
    print(json.dumps({"starvation": attack}))
    assert attack["victim"] == [200] * 3
    # Each attacker: two bodies held (its share), the rest refused at once.
    assert sorted(map(str, attack["attackers"])) == ["429"] * 4 + ["held"] * 4


def test_a_body_that_comes_a_byte_at_a_time_is_cut_at_the_minimum_rate(gateway):
    """Never silent for the body timeout (3 s), yet 64 KiB then a byte each 0.5 s: the minimum
    rate (32 KiB/s after the first 3 s) leaves it 3 + 2 s in all, not as long as it drips."""
    status, seconds = gateway_attacks.slow_body(
        gateway.url, "/v1/chat/completions", sent=64 << 10, every=0.5, seconds=20, key=VICTIM
    )
    print(json.dumps({"slow_body": [status, round(seconds, 2)]}))
    assert status == 408 and 4.5 < seconds < 8


def test_what_the_gateway_accepts_in_headers_its_replica_accepts_too(gateway):
    """A Host of 40 KB was copied into X-Forwarded-Host and Forwarded: 120 KB for the replica,
    which answered 431. Not a host name, it is no longer copied; and headers that, with the
    gateway's own, would pass the replica's limit are the gateway's 431, in the API's shape."""
    url = f"{gateway.url}/v1/completions"
    body = {"model": "tiny", "prompt": "The river", "max_tokens": 1}
    auth = {"Authorization": f"Bearer {VICTIM}"}
    answer = httpx.post(url, json=body, headers={**auth, "Host": "h" * 40_000}, timeout=30)
    assert answer.status_code == 200, answer.text
    answer = httpx.post(url, json=body, headers={**auth, "X-Pad": "p" * 63_000}, timeout=30)
    assert answer.status_code == 431
    assert answer.json()["error"]["type"] == "invalid_request_error"
