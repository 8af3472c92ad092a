"""Raw HTTP/1.1 over a socket, for requests no well-behaved client (httpx included) would send:
lies about the body's length, bodies that never end, headers that never end, a body cut off."""

import contextlib
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit


def address(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    return parts.hostname, parts.port


CLOSED = "closed"  # the server closed the connection without an answer
SILENT = "no answer"  # neither an answer nor a close within the time allowed
Status = int | str


def read_status(sock: socket.socket, timeout: float) -> tuple[Status, float]:
    """(status, seconds): the answer's status code, CLOSED or SILENT."""
    start, data = time.monotonic(), b""
    deadline = start + timeout
    while b"\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return SILENT, time.monotonic() - start
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return SILENT, time.monotonic() - start
        except OSError:  # reset
            return CLOSED, time.monotonic() - start
        if not chunk:
            break
        data += chunk
    elapsed = time.monotonic() - start
    return (int(data[9:12]), elapsed) if data.startswith(b"HTTP/1.1 ") else (CLOSED, elapsed)


def raw_request(base: str, data: bytes, timeout: float = 10.0) -> tuple[Status, float]:
    """Send `data` as is on a new connection; (status, seconds until it came)."""
    with socket.create_connection(address(base), timeout=timeout) as sock:
        start = time.monotonic()
        try:
            sock.sendall(data)
        except OSError:
            return CLOSED, time.monotonic() - start
        status, _ = read_status(sock, timeout)
        return status, time.monotonic() - start


def post_bytes(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def send_until_answered(
    sock: socket.socket, piece: bytes, counts: int, total: int, seconds: float, end: bytes
) -> int:
    """Send `piece` (worth `counts` bytes of what is measured) again and again until `total`
    went, `seconds` passed, or the server answered or closed; `end` if all of it went. What
    was sent, in `counts` units."""
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < total and time.monotonic() < deadline:
        sock.settimeout(0)
        try:
            sock.recv(1, socket.MSG_PEEK)
            break  # an answer (or a close) arrived: stop sending
        except BlockingIOError:
            pass
        except OSError:
            break
        sock.settimeout(5)  # a server that stopped reading without answering
        try:
            sock.sendall(piece)
        except OSError:
            break
        sent += counts
    else:
        with contextlib.suppress(OSError):
            sock.sendall(end)
    return sent


def chunked_upload(base: str, path: str, total: int, chunk: int = 1 << 16) -> tuple[Status, int]:
    """Send `total` bytes as a chunked body (no Content-Length), stopping as soon as the server
    answers or closes; (status, bytes of body sent)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = f"{chunk:x}\r\n".encode() + b"[" * chunk + b"\r\n"
    with socket.create_connection(address(base), timeout=10) as sock:
        sock.sendall(head.encode())
        sent = send_until_answered(sock, piece, chunk, total, 30, b"0\r\n\r\n")
        status, _ = read_status(sock, 10.0)
    return status, sent


def answer_of(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers by lower-case name, body) of one whole HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in lines)
    return int(status_line[9:12]), {k.strip().lower(): v.strip() for k, _, v in fields}, body


def cut_mid_body(base: str, path: str, stop: Callable[[], None], timeout: float = 30) -> bytes:
    """A POST whose body is still on its way when `stop()` (a SIGTERM) runs: its headers and
    the first half of its body are sent, the rest never is. All the listener sends back
    before it closes the connection (b"" if nothing)."""
    body = b'{"model": "tiny", "prompt": "The river", "max_tokens": 4}'
    request = post_bytes(path, body)
    with socket.create_connection(address(base), timeout=timeout) as sock:
        sock.sendall(request[: len(request) - len(body) // 2])
        time.sleep(0.5)  # for the request to reach the app, which now waits for its body
        stop()
        data = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                data += chunk
    return data
