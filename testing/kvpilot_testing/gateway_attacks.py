"""Attacks on a live `kvpilot gateway` that cost it memory or sockets, each returning what the
attacker got, for tests/gateway/test_hardening_live.py to judge and benchmarks/gateway_attacks.py
to report beside the gateway's resident memory. Raw sockets: no well-behaved client sends
these. Every loop is bounded in count and in time."""

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from kvpilot_testing.raw_http import Status, address, read_status, send_until_answered

CHUNK = 1 << 16


def rss_mib(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _answered(sock: socket.socket) -> bool:
    """Has the server answered or closed (without blocking)?"""
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) is not None
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(5)


def endless_header(base: str, size: int, seconds: float = 20.0) -> dict:
    """GET /health with one header `size` bytes long, sent until the server answers or
    closes; (status, MiB sent)."""
    with socket.create_connection(address(base), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = send_until_answered(sock, b"a" * CHUNK, CHUNK, size, seconds, b"\r\n\r\n")
        status, _ = read_status(sock, 10.0)
    return {"status": status, "sent_mib": round(sent / (1 << 20), 2)}


def header_flood(base: str, pid: int, clients: int = 6, size: int = 100 << 20) -> dict:
    """`clients` endless headers at once, the gateway's RSS sampled meanwhile."""
    peak, stop = [rss_mib(pid)], threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            with contextlib.suppress(OSError, RuntimeError):
                peak.append(rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = peak[0]
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _: endless_header(base, size), range(clients)))
    stop.set()
    sampler.join(5)
    return {
        "statuses": [r["status"] for r in results],
        "sent_mib": [r["sent_mib"] for r in results],
        "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(max(peak), 1),
    }


def small_objects_body(model: str, size: int) -> bytes:
    """A valid request of about `size` bytes made of many small JSON objects: the shape that
    costs the most parsed (a dict per 8 bytes or so)."""
    head = {"model": model, "prompt": "hi", "max_tokens": 1}
    filler = b'{"a":1},' * max(0, (size - 200) // 8)
    return json.dumps(head).encode()[:-1] + b', "user_data": [' + filler + b"{}]}"


def held_bodies(
    base: str,
    pid: int,
    model: str,
    clients: int,
    size: int,
    hold: float,
    body: bytes | None = None,
    spread: bool = False,
) -> dict:
    """`clients` requests with `size`-byte bodies (small_objects_body, unless `body` is given)
    for a model that has no ready replica, kept open `hold` seconds (the gateway holds them),
    the gateway's RSS read while they wait; then the clients leave. Statuses: what came back
    within the hold, or "held". `spread`: each client from an address of its own (127.0.0.10
    on), as that many clients without API keys are, each with its share of the budget."""
    body = body if body is not None else small_objects_body(model, size)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = rss_mib(pid)
    socks: list[socket.socket] = []
    statuses: list[Status] = []
    try:
        for i in range(clients):
            source = (f"127.0.0.{10 + i}", 0) if spread else None
            sock = socket.create_connection(address(base), timeout=10, source_address=source)
            socks.append(sock)
            with contextlib.suppress(OSError):  # refused mid-body: its answer is read below
                sock.sendall(head + body)
        deadline = time.monotonic() + hold
        peak = rss_mib(pid)
        while time.monotonic() < deadline:
            time.sleep(0.2)
            peak = max(peak, rss_mib(pid))
        for sock in socks:
            statuses.append(read_status(sock, 0.2)[0] if _answered(sock) else "held")
    finally:
        for sock in socks:
            sock.close()
    return {
        "body_mib": round(len(body) / (1 << 20), 2),
        "statuses": statuses,
        "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(peak, 1),
    }


def dripping_body(base: str, seconds: float) -> socket.socket:
    """A request whose body arrives a byte every 0.3 s for `seconds` (a background thread):
    in flight all along, never silent for long. The socket, to close afterwards."""
    sock = socket.create_connection(address(base), timeout=5)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: 100000\r\n\r\n"
    )

    def drip() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                sock.sendall(b" ")
            except OSError:
                return
            time.sleep(0.3)

    threading.Thread(target=drip, daemon=True).start()
    return sock


def _drip(sock: socket.socket, every: float, seconds: float) -> None:
    """A byte every `every` s, on a thread, for at most `seconds` (or until the socket fails)."""

    def drip() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(every)
            try:
                sock.sendall(b" ")
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()


def starved_victim(
    base: str, model: str, attacker_keys: list[str], victim_key: str, per_key: int, tries: int
) -> dict:
    """The body budget starved: per attacker key, `per_key` connections each send a body of
    4 MiB less 2 KiB (of one declared 4 MiB less 1.5 KiB, under every limit), then a byte a
    second. Meanwhile the victim sends a 20 KB chat, `tries`
    times a second apart. Its statuses, and the attackers' (held: still reading the body)."""
    size = (4 << 20) - (2 << 10)
    socks: list[socket.socket] = []
    try:
        for key in attacker_keys:
            for _ in range(per_key):
                head = (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {size + 512}\r\n\r\n"
                ).encode()
                sock = socket.create_connection(address(base), timeout=10)
                socks.append(sock)
                with contextlib.suppress(OSError):  # refused mid-body: its answer is read below
                    sock.sendall(head + b" " * size)
                    _drip(sock, 1.0, seconds=tries + 10)
        time.sleep(0.5)  # the gateway has taken in what it was sent
        # 20 KB, as a chat with a long history is, yet a prompt any model's context holds:
        # most of it the whitespace JSON allows between values.
        chat = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}]})
        body = (chat[:-1] + " " * 20_000 + ', "max_tokens": 1}').encode()
        victim = []
        for _ in range(tries):
            answer = httpx.post(
                f"{base}/v1/chat/completions",
                content=body,
                headers={
                    "Authorization": f"Bearer {victim_key}",
                    "Content-Type": "application/json",
                },
                timeout=30,
            )
            victim.append(answer.status_code)
            if answer.status_code != 200:
                print("victim:", answer.text[:300])
            time.sleep(1)
        attackers = [read_status(s, 0.2)[0] if _answered(s) else "held" for s in socks]
    finally:
        for sock in socks:
            sock.close()
    return {"victim": victim, "attackers": attackers}


def slow_body(
    base: str, path: str, sent: int, every: float, seconds: float, key: str = ""
) -> tuple[Status, float]:
    """A body of which `sent` bytes come at once and then a byte every `every` s, never silent
    for long: (the status, seconds from the first byte until it came), SILENT after `seconds`."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {sent + 100_000}\r\n\r\n"
    ).encode()
    with socket.create_connection(address(base), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(head + b" " * sent)
        _drip(sock, every, seconds)
        status, _ = read_status(sock, seconds)
        return status, time.monotonic() - start
