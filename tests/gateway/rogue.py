"""A replica that misbehaves on purpose, for the gateway's tests: a plain HTTP server in a
thread that answers /ready and /metrics as a server does, and each chat request with the stream
its last message names (ROGUE_STREAMS): what a broken or hostile model server could send. It
records the bodies it receives and whether the gateway closed a stream's connection."""

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator

from kvpilot_testing.gateway_attacks import rss_mib


def event(body: dict | str) -> bytes:
    return b"data: " + (body if isinstance(body, str) else json.dumps(body)).encode() + b"\n\n"


def chunk(ids: list[int], text: str = "a") -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "token_ids": ids}
    return event({"id": "chatcmpl-rogue", "created": 1, "choices": [choice]})


class Record:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.sent = 0  # bytes of the last stream that the gateway took
        self.closed = threading.Event()  # the gateway closed the last stream's connection


def _endless(write: Callable[[bytes], None]) -> None:
    """One good event, then one that never ends: 256 MiB with no blank line."""
    write(chunk([5]))
    write(b'data: {"choices": [{"delta": {"content": "')
    piece = b"a" * (1 << 20)
    for _ in range(256):
        write(piece)


def _not_json(write: Callable[[bytes], None]) -> None:
    """One good event, one that is not JSON, then comments until the gateway hangs up."""
    write(chunk([5]) + b"data: {bad\n\n")
    for _ in range(200):
        time.sleep(0.05)
        write(b": still here\n\n")


def _id_flood(write: Callable[[bytes], None]) -> None:
    """4M token ids in 40 events, then the connection lost without [DONE]: a break that a
    continuation would carry every id to the next replica."""
    for i in range(40):
        write(chunk([1000 + (i * 100_000 + j) % 40_000 for j in range(100_000)], "x"))


def _plain(write: Callable[[bytes], None]) -> None:
    write(chunk([5], "fine") + event("[DONE]"))


ROGUE_STREAMS = {"endless": _endless, "not-json": _not_json, "id-flood": _id_flood}


class _Handler(http.server.BaseHTTPRequestHandler):
    record: Record

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.record.bodies.append(body)
        messages = json.loads(body).get("messages") or [{}]
        stream = ROGUE_STREAMS.get(messages[-1].get("content"), _plain)
        self.record.sent = 0
        self.record.closed.clear()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes

        def write(data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()
            self.record.sent += len(data)

        try:
            stream(write)
        except OSError:  # the gateway closed the connection
            self.record.closed.set()

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def rogues(count: int) -> Iterator[tuple[list[str], Record]]:
    """`count` rogue replicas on loopback sharing one record: their URLs and the record."""
    record = Record()
    handler = type("Handler", (_Handler,), {"record": record})
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(count)]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers], record
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def peak_rss(pid: int) -> Iterator[dict[str, float]]:
    """The process's resident memory before and at its peak while the block runs, in MiB."""
    seen = {"before": rss_mib(pid), "peak": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            with contextlib.suppress(OSError, RuntimeError):
                seen["peak"] = max(seen["peak"], rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join(5)
        seen["peak"] = max(seen["peak"], rss_mib(pid))
