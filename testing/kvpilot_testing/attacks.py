"""Hostile and malformed requests against a live `kvpilot serve`, each returning what the server
answered (status codes, timings) for test_adversarial.py to judge and benchmarks/adversarial.py
to report. The server runs the tiny model with a 256-token context and the flags below."""

import asyncio
import json
import selectors
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from kvpilot_testing.adversary import error_shape, is_idle, wait_idle
from kvpilot_testing.raw_http import address, chunked_upload, post_bytes, raw_request

REQUEST_TIMEOUT, HEADER_TIMEOUT, BODY_TIMEOUT = 5.0, 1.0, 1.0
LIMITS = ("--max-waiting", "4", "--max-num-seqs", "4", "--request-timeout", "5")
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BODY_LIMIT = 4 << 20
BIG_TEXT = ("The river starts high in the mountains, where snow melts each spring. " * 50_000)[
    :3_500_000
]


CLIENT_TIMEOUT_FLAGS = (
    *("--header-timeout", str(HEADER_TIMEOUT)),
    *("--body-timeout", str(BODY_TIMEOUT)),
)


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def post(base: str, path: str, body: dict, timeout: float = 60.0, **kw) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=timeout, **kw)


def seed_overflow(base: str, repeats: int = 8) -> dict:
    """n=2 with seed 2**64 - 1: choice 1's seed overflows 64 bits. More repeats than
    --max-waiting, then normal requests."""
    body = {"messages": user("hi"), "n": 2, "seed": 2**64 - 1, "max_tokens": 4}
    statuses = [post(base, CHAT, body).status_code for _ in range(repeats)]
    after = [post(base, CHAT, {"messages": user("hi"), "max_tokens": 2}).status_code]
    return {"statuses": statuses, "after": after}


def chunked_body(base: str, total: int = 64 << 20) -> dict:
    status, sent = chunked_upload(base, CHAT, total)
    return {"status": status, "sent_mib": round(sent / (1 << 20), 1), "total_mib": total >> 20}


def content_length_lie(base: str) -> dict:
    head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    data = (head + "Content-Length: 10737418240\r\n\r\n{}").encode()
    status, seconds = raw_request(base, data, timeout=3.0)
    return {"status": status, "seconds": round(seconds, 3)}


COST_CASES = {
    # name: (path, body, words the error message must contain)
    "stop_list_20000": (CHAT, {"stop": [f"stop-{i}" for i in range(20_000)]}, ["stop"]),
    "stop_string_10000_chars": (CHAT, {"stop": ["x" * 10_000]}, ["stop"]),
    "n16_huge_max_tokens": (CHAT, {"n": 16, "max_tokens": 10**9}, []),
    "top_logprobs_21": (CHAT, {"logprobs": True, "top_logprobs": 21}, ["20"]),
    "logprobs_21": (COMPLETIONS, {"prompt": "hi", "logprobs": 21}, ["20"]),
}


def cost_limit(base: str, name: str) -> dict:
    path, extra, _ = COST_CASES[name]
    body = {"max_tokens": 4, **({} if path == COMPLETIONS else {"messages": user("hi")}), **extra}
    response = post(base, path, body)
    return {"status": response.status_code, "error": error_shape(response)}


def few_stops(base: str) -> dict:
    body = {"messages": user("hi"), "max_tokens": 4, "stop": ["\n\n", "###", "User:"]}
    return {"status": post(base, CHAT, body).status_code}


def parallel_tokenize(base: str, clients: int = 4) -> dict:
    with ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(post, base, "/tokenize", {"prompt": BIG_TEXT}, 120) for _ in range(clients)
        ]
        return {"statuses": [f.result().status_code for f in futures]}


def huge_chat_message(base: str) -> dict:
    response = post(base, CHAT, {"messages": user(BIG_TEXT), "max_tokens": 4}, 120)
    return {"status": response.status_code, "error": error_shape(response)}


def long_detokenize(base: str, count: int = 600_000) -> dict:
    body = json.dumps({"tokens": [1000 + i % 9000 for i in range(count)]}, separators=(",", ":"))
    assert len(body) < BODY_LIMIT
    response = httpx.post(f"{base}/detokenize", content=body, timeout=120)
    return {"status": response.status_code, "tokens": count}


def long_conversation(base: str, headers: dict | None = None, turns: int = 1000) -> dict:
    """~3.5 MB of alternating turns then a short question, for --context-overflow
    truncate-oldest: every turn but the last must go."""
    filler = BIG_TEXT[: len(BIG_TEXT) // (2 * turns)]
    messages = []
    for _ in range(turns):
        messages += [{"role": "user", "content": filler}, {"role": "assistant", "content": filler}]
    messages += user("And now?")
    response = post(base, CHAT, {"messages": messages, "max_tokens": 4}, 120, headers=headers)
    dropped = response.headers.get("X-KVPilot-Dropped-Messages")
    return {"status": response.status_code, "dropped": dropped, "messages": len(messages)}


def _long_generation(base: str, timeout_field: bytes) -> tuple[int, float]:
    body = b'{"prompt":"The river","max_tokens":240,"ignore_eos":true,"n":2,"timeout":'
    start = time.monotonic()
    try:
        status = httpx.post(
            f"{base}{COMPLETIONS}",
            content=body + timeout_field + b"}",
            headers={"Content-Type": "application/json"},
            timeout=120,
        ).status_code
    except httpx.HTTPError:
        status = 0
    return status, round(time.monotonic() - start, 2)


def timeout_ceiling(base: str) -> dict:
    """Per-request timeouts beyond the server's, at once (two n=2 requests fill 4 slots, so
    the work takes far longer than the server's --request-timeout); then a smaller one."""
    cases = {"1e308": b"1e308", "Infinity": b"Infinity"}
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {k: pool.submit(_long_generation, base, v) for k, v in cases.items()}
        out = {k: f.result() for k, f in futures.items()}
    # A tenth of the work's time (240 tokens twice, about half a second on a fast CPU): a
    # timeout at about that time made the verdict a race between the last step and the clock.
    out["0.1"] = _long_generation(base, b"0.1")
    return out


async def _burst(base: str, count: int, max_tokens: int) -> list[httpx.Response]:
    body = {"messages": user("hi"), "max_tokens": max_tokens, "ignore_eos": True}
    limits = httpx.Limits(max_connections=count + 4)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(client.post(CHAT, json=body) for _ in range(count)))


def burst(base: str, count: int = 8, max_tokens: int = 8) -> dict:
    return {"statuses": [r.status_code for r in asyncio.run(_burst(base, count, max_tokens))]}


def overload(base: str, count: int = 40) -> dict:
    responses = asyncio.run(_burst(base, count, 200))
    retry = [r.headers.get("Retry-After") for r in responses if r.status_code == 429]
    return {"statuses": sorted(r.status_code for r in responses), "retry_after": retry}


MALFORMED = {
    # name: (path, raw body)
    "lone_surrogate": (CHAT, b'{"messages":[{"role":"user","content":"\\ud800"}]}'),
    "max_tokens_5000_digits": (CHAT, b'{"messages":[],"max_tokens":' + b"9" * 5000 + b"}"),
    "nested_100000": (CHAT, b"[" * 100_000),
    "nested_in_object": (CHAT, b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "invalid_utf8": (CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}'),
    "top_level_array": (CHAT, b'[{"messages":[{"role":"user","content":"hi"}]}]'),
    "empty_body": (CHAT, b""),
    "completion_lone_surrogate": (COMPLETIONS, b'{"prompt":"a\\udc00b","max_tokens":2}'),
    "tokenize_lone_surrogate": ("/tokenize", b'{"messages":[{"role":"user","content":"\\udfff"}]}'),
    "infinite_penalty": (COMPLETIONS, b'{"prompt":"a","repetition_penalty":Infinity}'),
}


def malformed(base: str, name: str) -> dict:
    path, body = MALFORMED[name]
    status, seconds = raw_request(base, post_bytes(path, body), timeout=10.0)
    return {"status": status, "seconds": round(seconds, 3)}


def slow_clients(base: str, header_timeout: float, body_timeout: float) -> dict:
    """Half a request line, then silence; headers announcing 1000 bytes, 10 sent, then silence.
    Both at once; each waited for up to its timeout + 2.5 s."""
    head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
    cases = {
        "half_headers": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.", header_timeout),
        "stalled_body": (head.encode() + b'{"messages"', body_timeout),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {k: pool.submit(raw_request, base, d, t + 2.5) for k, (d, t) in cases.items()}
        return {k: [f.result()[0], round(f.result()[1], 2)] for k, f in futures.items()}


def disconnect_mid_stream(base: str, n: int, rounds: int) -> dict:
    """Streams abandoned right after their first chunk. The server needs a moment to see the
    disconnect and free the slots: each round waits for that (bounded), so a slow cleanup shows
    as `not_idle` rather than as the next round's 429."""
    body = {"messages": user("hi"), "max_tokens": 200, "ignore_eos": True, "n": n, "stream": True}
    first, not_idle = [], []
    for _ in range(rounds):
        with (
            httpx.Client(base_url=base, timeout=60) as client,
            client.stream("POST", CHAT, json=body) as response,
        ):
            first.append(response.status_code)
            next(response.iter_lines(), None)
        gauges = wait_idle(base)
        if not is_idle(gauges):
            not_idle.append(gauges)
    return {"statuses": first, "not_idle": not_idle}


def oversized_headers(base: str) -> dict:
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    big_line = head + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    many_headers = head + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)) + b"\r\n"
    return {
        "header_line_1mib": raw_request(base, big_line, 5.0)[0],
        "headers_10000": raw_request(base, many_headers, 5.0)[0],
    }


def idle_connections(base: str, count: int, header_timeout: float) -> dict:
    """`count` connections that never send a byte: still open after header_timeout + 2 s?"""
    socks = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(address(base), timeout=5))
        health = httpx.get(f"{base}/health", timeout=5).status_code
        time.sleep(header_timeout + 2)
        # A socket the server closed (or answered) is readable; one it forgot is not.
        selector = selectors.DefaultSelector()
        for s in socks:
            selector.register(s, selectors.EVENT_READ)
        readable = {key.fileobj for key, _ in selector.select(timeout=0.5)}
        selector.close()
    finally:
        for s in socks:
            s.close()
    still_open = sum(1 for s in socks if s not in readable)
    return {"opened": len(socks), "health_meanwhile": health, "still_open": still_open}


def semantic_oddities(base: str) -> dict:
    """Well-formed requests a client should not send."""
    unknown = post(base, CHAT, {"model": "gpt-9", "messages": user("hi"), "max_tokens": 2})
    text_plain = raw_request(
        base,
        post_bytes(
            CHAT, b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}', "text/plain"
        ),
        30.0,
    )[0]
    return {
        "unknown_model": [unknown.status_code, error_shape(unknown).get("type")],
        "text_plain": text_plain,
    }
