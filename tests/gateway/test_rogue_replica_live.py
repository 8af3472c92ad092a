"""A broken or hostile replica against the real gateway (`--backend`, with the gateway secret,
so streams are resumable and their events parsed): rogue replicas (tests/gateway/rogue.py) send
an event that never ends, an event that is not JSON, and a flood of token ids. Each was a
finding: 256 MiB without an end cost the gateway +510 MiB and 80 s, a bad event crashed the
relay and cut the client's stream without a word, 4M ids became a 27.5 MB continuation. Now the
client reads an error event (or the whole stream), the gateway's memory and time stay bounded,
and the rogue's connection is closed."""

import time
from collections.abc import Iterator

import httpx
import pytest

from kvpilot_common import trust
from kvpilot_testing.kube.cluster import wait_for
from kvpilot_testing.kube.gateway import Gateway
from tests.gateway.rogue import Record, peak_rss, rogues

SECRET = "rogue-test-secret"
RSS_GROWTH_MIB = 50  # a bounded buffer and its parse: a few MiB; each attack cost hundreds


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> Iterator[tuple[Gateway, Record]]:
    tmp = tmp_path_factory.mktemp("rogue")
    with rogues(2) as (urls, record):
        backend = "rogue=" + ",".join(urls)
        gateway = Gateway(None, None, tmp / "gateway.log", "--backend", backend)
        gateway.args += ("--scrape-interval", "0.2", "--backend-secret")  # rogues: as if ours
        gateway.extra_env = {trust.ENV: SECRET}
        gateway.start()
        try:
            models = f"{gateway.url}/v1/models"
            wait_for(
                "both rogues ready",
                lambda: httpx.get(models).json()["data"][0]["ready_replicas"] == 2,
                timeout=30,
                interval=0.2,
            )
            assert _stream(gateway.url, "hello")[0][-1] == "data: [DONE]"  # warm: imports
            yield gateway, record
        finally:
            gateway.stop()
            print(gateway.log()[-3000:])


def _stream(url: str, what: str) -> tuple[list[str], float]:
    """The lines of a streamed chat whose message names the rogue's stream, and the time."""
    body = {"model": "rogue", "messages": [{"role": "user", "content": what}], "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    return lines, time.monotonic() - started


def test_an_endless_event_ends_the_stream_with_an_error_event_at_a_bounded_cost(front):
    gateway, record = front
    assert gateway.process is not None
    with peak_rss(gateway.process.pid) as rss:
        lines, took = _stream(gateway.url, "endless")
    print({"took_s": round(took, 2), "rss_growth_mib": round(rss["peak"] - rss["before"], 1)})
    assert lines[0].startswith("data: {") and "token_ids" not in lines[0]
    assert "longer than 4 MiB" in lines[-2] and lines[-1] == "data: [DONE]"
    assert took < 10
    assert record.closed.wait(10) and record.sent < 32 << 20  # not the 256 MiB it had
    assert rss["peak"] - rss["before"] < RSS_GROWTH_MIB
    assert "Traceback" not in gateway.log()


def test_an_event_that_is_not_json_gets_an_error_event_and_the_replica_is_closed(front):
    gateway, record = front
    lines, _ = _stream(gateway.url, "not-json")
    assert len(lines) == 3 and '"content": "a"' in lines[0]
    assert "not JSON" in lines[1] and '"code": "bad_gateway"' in lines[1]
    assert lines[2] == "data: [DONE]"
    assert record.closed.wait(5)  # its comments after the bad event found the socket closed
    assert "Traceback" not in gateway.log()


def test_a_flood_of_token_ids_is_relayed_without_being_kept(front):
    gateway, record = front
    assert gateway.process is not None
    before = len(record.bodies)
    with peak_rss(gateway.process.pid) as rss:
        lines, _ = _stream(gateway.url, "id-flood")
    print({"rss_growth_mib": round(rss["peak"] - rss["before"], 1)})
    chunks = [line for line in lines if '"content": "x"' in line]
    assert len(chunks) == 40 and not any("token_ids" in line for line in lines)
    # Broken without [DONE], past what a continuation can carry: the error event, and no
    # continuation sent to the other rogue.
    assert "failed mid-stream" in lines[-2] and lines[-1] == "data: [DONE]"
    assert len(record.bodies) == before + 1
    assert rss["peak"] - rss["before"] < RSS_GROWTH_MIB
