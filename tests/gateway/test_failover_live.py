"""Mid-stream failover on loopback: two real `kvpilot serve` of the tiny model behind the real
gateway (`--backend`, the gateway secret shared through the environment). The server
answering a stream is killed (SIGKILL) right after the client's first chunk; the client, the
official openai client, reads on and gets exactly what an uninterrupted run gives, text, token
ids and usage, greedy and sampled with a seed, and the gateway counts one resume. A non-streamed
request whose server is killed mid-generation is sent again to the other and answers the same."""

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from kvpilot_common import metric_names as names
from kvpilot_common import stored_ids, trust
from kvpilot_testing.kube.cluster import wait_for
from kvpilot_testing.kube.gateway import Gateway
from kvpilot_testing.live_server import start_tiny_server, stop_servers, stop_side_by_side
from tests.gateway.live import metric_at

SECRET = "shared-by-gateway-and-servers"
RESUMES, RETRIES = names.GATEWAY_RESUMES, names.GATEWAY_RETRIES
LONG = ["--max-model-len", "1024", "--kv-cache-bytes", "64MiB"]
ASK = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Tell me everything"}],
    "max_tokens": 600,  # long enough that the kill lands mid-stream
    "extra_body": {"ignore_eos": True, "return_token_ids": True},
}


class Servers:
    """Two servers on fixed ports for the module: a test kills one, the next test's setup starts
    it again on its port (the gateway's --backend list names the ports)."""

    def __init__(self, model_dir) -> None:
        self.model_dir = model_dir
        with ThreadPoolExecutor(2) as pool:  # their start-ups overlap
            self.running: list = list(
                pool.map(lambda _: start_tiny_server(model_dir, *LONG), (0, 1))
            )

    def urls(self) -> list[str]:
        return [base for _, base in self.running]

    def revive(self) -> None:
        """Start again, on its port, each server a test killed."""
        for i, (proc, base) in enumerate(self.running):
            if proc.poll() is not None:
                port = int(base.rsplit(":", 1)[1])
                self.running[i] = start_tiny_server(self.model_dir, *LONG, port=port)

    def busy(self) -> int:
        """The one generating now."""
        return (
            wait_for(
                "a server generating",
                lambda: next(
                    (
                        i + 1
                        for i, u in enumerate(self.urls())
                        if metric_at(u, names.REQUESTS_RUNNING)
                    ),
                    None,
                ),
                timeout=10,
                interval=0.01,
            )
            - 1
        )

    def kill(self, index: int) -> None:
        proc, _ = self.running[index]
        proc.kill()
        proc.wait()
        proc.log.close()

    def stop(self) -> None:
        """Side by side: each drains for a moment, and one after another the wait was twice."""
        alive = [proc for proc, _ in self.running if proc.poll() is None]
        for proc, _ in self.running:
            if proc not in alive:
                proc.log.close()
        stop_servers(alive)


@pytest.fixture(scope="module")
def running(tiny_dir, tmp_path_factory) -> Iterator[tuple[Servers, Gateway]]:
    """The servers and the gateway, shared by the module's tests (each kills one server)."""
    os.environ[trust.ENV] = SECRET  # the servers and the gateway read it at start
    servers = gateway = None
    try:
        servers = Servers(tiny_dir("llama"))
        backends = "tiny=" + ",".join(servers.urls())
        log = tmp_path_factory.mktemp("failover") / "gateway.log"
        gateway = Gateway(None, None, log, "--backend", backends)
        gateway.args += ("--scrape-interval", "0.2", "--routing", "least-load", "--backend-secret")
        yield servers, gateway.start()
    finally:
        del os.environ[trust.ENV]
        stop_side_by_side([part.stop for part in (gateway, servers) if part is not None])


@pytest.fixture
def setup(running) -> Iterator[tuple[Servers, Gateway, openai.OpenAI, "Counts"]]:
    """Both servers up and seen usable by the gateway; its counters as they stand."""
    servers, gateway = running
    servers.revive()
    wait_for("the gateway to use both servers", lambda: _usable(gateway) == 2, timeout=30)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0)
    try:
        yield servers, gateway, client, Counts(gateway)
    finally:
        client.close()  # no socket left for a later test's warnings-as-errors to find
        print(gateway.log()[-3000:])  # shown by pytest when the test fails


def _usable(gateway: Gateway) -> int:
    cards = httpx.get(f"{gateway.url}/v1/models", timeout=5).json()["data"]
    return next((c["ready_replicas"] for c in cards if c["id"] == "tiny"), 0)


class Counts:
    """A gateway counter's growth since the test began (the gateway outlives the test)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.before = {name: gateway.metric(name) for name in (RESUMES, RETRIES)}

    def since(self, name: str) -> float:
        return self.gateway.metric(name) - self.before[name]


def _read(chunks) -> tuple[str, list[int], object]:
    text, ids, usage = "", [], None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            ids += choice.model_extra["token_ids"]
    return text, ids, usage


def _stream(client, sampling: dict):
    return client.chat.completions.create(
        **ASK, **sampling, stream=True, stream_options={"include_usage": True}
    )


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 17}], ids=["greedy", "seeded"]
)
def test_a_stream_whose_server_is_killed_goes_on_from_the_other_unchanged(setup, sampling):
    servers, _, client, counts = setup
    expected = _read(_stream(client, sampling))
    assert len(expected[1]) == expected[2].completion_tokens == 600

    chunks = iter(_stream(client, sampling))
    first = next(chunks)
    servers.kill(servers.busy())
    got = _read([first, *chunks])
    assert got[0] == expected[0] and got[1] == expected[1]
    assert got[2].completion_tokens == 600 and got[2].prompt_tokens == expected[2].prompt_tokens
    assert counts.since(RESUMES) == 1


def test_a_non_streamed_request_whose_server_is_killed_is_answered_by_the_other(setup):
    servers, _, client, counts = setup
    sampling = {"temperature": 0.8, "seed": 5}
    expected = client.chat.completions.create(**ASK, **sampling)
    answers: list = []
    asking = threading.Thread(
        target=lambda: answers.append(client.chat.completions.create(**ASK, **sampling))
    )
    started = time.monotonic()
    asking.start()
    servers.kill(servers.busy())
    asking.join(timeout=120)
    assert answers, f"no answer after {time.monotonic() - started:.0f} s"
    assert answers[0].choices[0].message.content == expected.choices[0].message.content
    assert answers[0].usage.completion_tokens == 600
    assert counts.since(RETRIES) == 1


def test_a_stored_conversation_goes_on_at_its_replica_whatever_the_balancer_picks(setup, tmp_path):
    """previous_response_id over three turns through a round-robin gateway, which would send
    each turn to the other replica: every turn reaches the one that stored the conversation
    (the tag in the response ids), and so do GET and DELETE; an id of no replica, or of one
    killed, is refused in words, never a conversation started over."""
    servers, *_ = setup
    backends = "tiny=" + ",".join(servers.urls())
    gateway = Gateway(None, None, tmp_path / "round-robin.log", "--backend", backends)
    gateway.args += ("--scrape-interval", "0.2", "--routing", "round-robin", "--backend-secret")
    gateway.start()
    stack = contextlib.ExitStack()
    try:
        wait_for("both servers usable", lambda: _usable(gateway) == 2, timeout=30)
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="-", max_retries=0)
        stack.callback(client.close)
        turns = [client.responses.create(model="tiny", input="Say hello", max_output_tokens=4)]
        for words in ("Again", "Once more"):
            turns.append(
                client.responses.create(
                    model="tiny",
                    input=words,
                    previous_response_id=turns[-1].id,
                    max_output_tokens=4,
                )
            )
        tags = {stored_ids.tag_of(turn.id) for turn in turns}
        by_tag = {
            stored_ids.replica_tag(url.split("//")[1]): i for i, url in enumerate(servers.urls())
        }
        assert len(tags) == 1 and tags <= by_tag.keys(), (tags, by_tag)
        # Each turn's prompt holds the turns before it.
        lengths = [turn.usage.input_tokens for turn in turns]
        assert lengths == sorted(set(lengths)), lengths

        for _ in range(2):  # round-robin would alternate: both reach the holder
            assert client.responses.retrieve(turns[-1].id).output_text == turns[-1].output_text
        (asked,) = client.responses.input_items.list(turns[-1].id)
        assert asked.content[0].text == "Once more"
        client.responses.delete(turns[0].id)
        with pytest.raises(openai.NotFoundError, match="No stored response"):
            client.responses.retrieve(turns[0].id)
        with pytest.raises(openai.NotFoundError, match="names none"):
            client.responses.retrieve("resp_" + "0" * 32)
        with pytest.raises(openai.NotFoundError, match="on a replica serving now"):
            client.responses.retrieve(f"resp_{'0' * 12}_{'0' * 32}")

        servers.kill(by_tag[tags.pop()])
        wait_for("one server usable", lambda: _usable(gateway) == 1, timeout=30)
        # 503 while the gateway has it marked down but still listed, 404 once its probe drops
        # it: both in words, neither a fresh start.
        gone = (openai.NotFoundError, openai.InternalServerError)
        with pytest.raises(gone, match=r"has left .* or is not ready|is not answering now"):
            client.responses.create(
                model="tiny", input="Still there?", previous_response_id=turns[-1].id
            )
    finally:
        stack.close()
        gateway.stop()
        print(gateway.log()[-3000:])
