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
) -> dict:
    """`clients` requests with `size`-byte bodies (small_objects_body, unless `body` is given)
    for a model that has no ready replica, kept open `hold` seconds (the gateway holds them),
    the gateway's RSS read while they wait; then the clients leave. Statuses: what came back
    within the hold, or "held"."""
    body = body if body is not None else small_objects_body(model, size)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = rss_mib(pid)
    socks: list[socket.socket] = []
    statuses: list[Status] = []
    try:
        for _ in range(clients):
            sock = socket.create_connection(address(base), timeout=10)
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
