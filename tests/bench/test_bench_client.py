"""The client against scripted answers (httpx.MockTransport): outcomes, SSE timing and usage,
and which /tokenize shape each kind of server is asked in."""

import asyncio
import json

import httpx
import pytest

from kvpilot_bench import tokens
from kvpilot_bench.client import Endpoint, Record, body, send
from kvpilot_bench.plan import Planned
from kvpilot_bench.prompts import Job, Prompt
from kvpilot_bench.workload import Distribution, RequestClass

ROOT = "http://bench.test"
FIXED = Distribution("fixed", {"value": 8.0})


def _job(stream=True, api="chat", after_s=None, after_tokens=None, tier=None) -> Job:
    cls = RequestClass("c", 1.0, FIXED, FIXED, api=api, stream=stream, service_tier=tier)
    planned = Planned(0, 0.0, cls, 8, 8, after_s, after_tokens, 1)
    return Job(planned, Prompt(text="hello there"), 8, False, 8)


def _sse(*events, done=True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


def _chunk(text, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def _run(handler, job) -> Record:
    async def go():
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as http:
            rec = Record(0, "c", job.planned.cls.stream, 0.0)
            await send(http, Endpoint(ROOT, "m", "k"), job, rec, timeout_s=5.0)
            return rec

    return asyncio.run(go())


def test_body_is_what_the_class_asks_for():
    chat = body(_job(tier="flex"), "m")
    assert chat["messages"] == [{"role": "user", "content": "hello there"}]
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}
    assert chat["ignore_eos"] and chat["max_tokens"] == 8 and chat["service_tier"] == "flex"
    text = body(_job(stream=False, api="completions"), "m")
    assert text["prompt"] == "hello there" and "stream" not in text and "messages" not in text


def test_a_stream_is_timed_and_counted():
    usage = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
    content = _sse(_chunk(""), _chunk("a"), _chunk("b"), _chunk("c", "length"), usage)
    seen = {}

    def handler(request):
        seen["auth"] = request.headers["authorization"]
        seen["path"] = request.url.path
        return httpx.Response(200, content=content)

    rec = _run(handler, _job())
    assert rec.outcome == "ok" and rec.status == 200
    assert seen == {"auth": "Bearer k", "path": "/v1/chat/completions"}
    assert rec.ttft is not None and len(rec.itl) == 2  # three chunks with text: two gaps
    assert (rec.tokens_in, rec.tokens_out) == (11, 3) and rec.e2e >= rec.ttft


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (httpx.Response(429, json={"error": {"message": "busy"}}), "http_429"),
        (httpx.Response(400, json={"error": {"message": "bad"}}), "http_400"),
        (httpx.Response(503, text="down"), "http_503"),
        # An error event after the stream began, in OpenAI's shape with a named code.
        (httpx.Response(200, content=_sse(_chunk("a"), {"error": {"code": "request_timeout"}})),
         "http_408"),
        (httpx.Response(200, content=_sse(_chunk("a"), {"error": {"message": "?"}})),
         "stream_error"),
        (httpx.Response(200, content=_sse(_chunk("a"), done=False)), "connection_error"),
        (httpx.Response(200, content=b"data: {not json\n\n"), "stream_error"),
    ],
)  # fmt: skip
def test_outcomes(answer, outcome):
    rec = _run(lambda request: answer, _job())
    assert rec.outcome == outcome and rec.e2e is not None


def test_connection_refused_and_cancel_after_tokens():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    assert _run(refuse, _job()).outcome == "connection_error"
    content = _sse(*(_chunk(c) for c in "abcdef"), _chunk("", "length"))
    rec = _run(lambda request: httpx.Response(200, content=content), _job(after_tokens=2))
    assert rec.outcome == "cancelled" and rec.tokens_out == 2
    # A request that finishes before its planned cancellation is ok.
    short = _sse(_chunk("a"), _chunk("b", "stop"))
    rec = _run(lambda request: httpx.Response(200, content=short), _job(after_tokens=2))
    assert rec.outcome == "ok"


def test_a_whole_answer_and_a_timed_cancel():
    whole = {"choices": [{"text": "xyz"}], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}
    rec = _run(lambda r: httpx.Response(200, json=whole), _job(stream=False, api="completions"))
    assert rec.outcome == "ok" and rec.ttft is None and rec.tokens_out == 7

    async def slow(request):
        await asyncio.sleep(2)
        return httpx.Response(200, json=whole)

    rec = _run(slow, _job(stream=False, after_s=0.05))
    assert rec.outcome == "cancelled" and rec.e2e < 1.0


@pytest.mark.parametrize(
    ("server", "counter", "count"),
    [
        ("kvpilot", "server /tokenize", 4),
        ("llama.cpp", "server /tokenize", 4),
        ("tgi", "server /tokenize", 4),
        ("none", "estimate", 3),  # ceil(2 words x 1.3)
    ],
)
def test_tokenize_shapes(server, counter, count):
    def handler(request):
        sent = json.loads(request.content)
        if server == "none":
            return httpx.Response(404)
        if server == "kvpilot" and "prompt" in sent:
            return httpx.Response(200, json={"count": 4, "tokens": [1, 2, 3, 4],
                                             "max_model_len": 256})  # fmt: skip
        if server == "kvpilot" and "messages" in sent:
            return httpx.Response(200, json={"count": 30, "tokens": [0] * 30})
        if server == "llama.cpp" and "content" in sent:
            return httpx.Response(200, json={"tokens": [1, 2, 3, 4]})
        if server == "tgi" and "inputs" in sent:
            return httpx.Response(200, json=[{"id": i} for i in range(4)])
        return httpx.Response(422, json={"error": "wrong shape"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            found = await tokens.probe(http, ROOT, "m", None)
            return found, await found.count(["two words"])

    found, counts = asyncio.run(go())
    assert found.name == counter and counts == [count]
    if server == "kvpilot":
        assert found.max_model_len == 256 and found.chat_overhead == 26
