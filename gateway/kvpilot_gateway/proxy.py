"""Forwarding one request to one replica and its answer back, byte for byte as it arrives.

Nothing is buffered: a stream's events reach the client as the replica writes them (a
resumable stream's whole events: resume.py). The client leaving (before the replica answered,
or mid-stream) closes the upstream connection at once, which makes the replica abort the
request and free its KV cache; except before the answer of a tenant with a tokens limit, which
runs on to its headers for their count (usage.settle_when_answered). A replica that breaks
mid-stream, or stays silent past the idle timeout, ends a stream with an error event in
OpenAI's shape, as the server itself ends one whose request failed; any other body is cut, so
the client sees it incomplete. One that does not start answering within the upstream timeout
gets the client a 504 (not a retry: it may be generating). A resumable stream's replica that
sends what no server sends (resume.Malformed: an endless event, one that is not JSON) ends the
stream with an error event too, its connection closed.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from kvpilot_common import trust
from kvpilot_common.http.errors import error_body
from kvpilot_gateway.headers import end_to_end
from kvpilot_gateway.resume import Malformed, Tracker
from kvpilot_gateway.usage import Reservation, UsageTap

T = TypeVar("T")
log = logging.getLogger("kvpilot.gateway")
_UNREPORTED: set[tuple] = set()  # replicas warned about, once each
CLIENT_CLOSED = 499  # nginx's code for a client that left; only metrics and logs see it


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body was read already: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Awaitable[T], receive: Receive, cancel: bool = True) -> T:
    """`work`'s result; ClientDisconnect if the client leaves first, `work` then cancelled
    unless told otherwise (the caller, which passed a task, then sees to it)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if cancel and not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientDisconnect()


def error_event(message: str, status: int = 502) -> bytes:
    body = error_body(status, message)
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


# What breaks an upstream exchange: aiohttp's own errors, a timeout, the socket itself.
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class UpstreamTimeout(Exception):
    """The replica took the request but sent nothing within the upstream timeout."""


# Given a resumable stream's tracker and why its replica broke, the next replica's response
# (its body still to read), or None when no other replica takes it (resume.py).
Resume = Callable[[Tracker, str], Awaitable[aiohttp.ClientResponse | None]]


class Passthrough:
    """The ASGI response that relays an upstream aiohttp response whose body is still to read.
    `done(outcome)` runs once at the end: ok, client_closed or upstream_error. With a tracker
    and `resume`, a stream that breaks goes on from another replica, up to `max_resumes`
    times."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        done: Callable[[str], None],
        idle_timeout: float,
        tracker: Tracker | None = None,
        resume: Resume | None = None,
        max_resumes: int = 0,
        reservation: Reservation | None = None,  # the tenant's tokens, settled at the end
    ) -> None:
        self.upstream, self.done, self.idle_timeout = upstream, done, idle_timeout
        self.reservation, self.usage = reservation, UsageTap()
        if reservation is not None:
            reservation.taken = True
        content_type = upstream.headers.get("content-type", "")
        self.sse = content_type.startswith("text/event-stream")
        self.tracker = tracker if self.sse and upstream.status == 200 else None
        self.resume, self.max_resumes = resume, max_resumes
        self.malformed = ""  # what the replica sent that no server sends, once it has

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = "upstream_error"
        headers = self.usage.headers(end_to_end(self.upstream.raw_headers))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.upstream.status,
                    "headers": headers,
                }
            )
            relay = asyncio.ensure_future(self._relay(send))
            left = asyncio.ensure_future(until_disconnect(receive))
            await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
            if not relay.done():  # the client went away: stop reading the replica
                relay.cancel()
                outcome = "client_closed"
                await asyncio.gather(relay, return_exceptions=True)
                return
            left.cancel()
            outcome = relay.result()
            if outcome in ("upstream_error", "upstream_timeout") and not self.sse:
                raise ConnectionError("the replica closed the connection mid-body")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if outcome == "ok":
                self.upstream.release()  # read to its end: the connection is reused
            else:
                self.upstream.close()  # the replica sees the connection close and aborts
            if self.reservation is not None:
                self._settle(self.reservation, outcome)
            self.done(outcome)

    def _settle(self, reservation: Reservation, outcome: str) -> None:
        """The tenant's tokens: as the replica reported them, else (the client or the replica
        left before the report) an estimate, so that leaving early does not dodge the limit:
        a stream's relayed events, each about a token (its replica stops when it is closed);
        a whole answer's reservation, which bounds it; an error's prompt."""
        if self.usage.tokens is not None:
            reservation.settle(self.usage.tokens)
            return
        if self.sse or self.upstream.status != 200:
            reservation.settle(reservation.cost.prompt + self.usage.events)
            return
        reservation.keep()
        if outcome == "ok":
            where = self.upstream.url.host, self.upstream.url.port
            if where not in _UNREPORTED:
                _UNREPORTED.add(where)
                log.warning(
                    "replica %s:%s sent no token count: is %s set on it as on the gateway? "
                    "Its answers are charged to tokens-per-minute limits what they reserved",
                    *where,
                    trust.ENV,
                )

    async def _relay(self, send: Send) -> str:
        if self.tracker is not None:
            return await self._relay_resumable(send, self.tracker)
        content = self.upstream.content
        try:
            while chunk := await asyncio.wait_for(content.readany(), self.idle_timeout):
                if self.sse:
                    self.usage.feed(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UPSTREAM_ERRORS as exc:
            timed_out = type(exc) is TimeoutError  # wait_for's, not a socket's
            if self.sse:
                event = self._broken(timed_out)
                await send({"type": "http.response.body", "body": event, "more_body": True})
            return "upstream_timeout" if timed_out else "upstream_error"
        return "ok"

    async def _relay_resumable(self, send: Send, tracker: Tracker) -> str:
        resumes = 0
        while True:
            broke = await self._relay_events(send, tracker)
            if broke is None:
                return "ok"
            if broke == "malformed":  # the same fault on the next replica: no resume
                url = self.upstream.url
                log.warning(
                    "replica %s:%s sent %s: its stream ends", url.host, url.port, self.malformed
                )
                event = error_event(f"The model replica sent {self.malformed}; retry the request")
                await send({"type": "http.response.body", "body": event, "more_body": True})
                return "upstream_error"
            if self.resume is not None and tracker.resumable and resumes < self.max_resumes:
                upstream = await self.resume(tracker, broke)
                if upstream is not None:
                    self.upstream.close()
                    self.upstream, resumes = upstream, resumes + 1
                    tracker.restart()
                    continue
            timed_out = broke == "idle_timeout"
            event = self._broken(timed_out)
            await send({"type": "http.response.body", "body": event, "more_body": True})
            return "upstream_timeout" if timed_out else "upstream_error"

    def _broken(self, timed_out: bool) -> bytes:
        """The error event that ends a stream no replica could finish."""
        if timed_out:
            return error_event(
                f"The model replica sent nothing for {self.idle_timeout:g} s; retry the request",
                504,
            )
        return error_event("The model replica failed mid-stream; retry the request")

    async def _relay_events(self, send: Send, tracker: Tracker) -> str | None:
        """Relay the current replica's whole events to its end: None when the stream is
        complete, else why it broke (connection, idle_timeout, error_event, ended_early,
        malformed)."""
        content = self.upstream.content
        try:
            while chunk := await asyncio.wait_for(content.readany(), self.idle_timeout):
                self.usage.feed(chunk)
                try:
                    relayed, failed = tracker.feed(chunk)
                except Malformed as exc:
                    relayed, failed, self.malformed = exc.relayed, True, str(exc)
                if relayed:
                    await send({"type": "http.response.body", "body": relayed, "more_body": True})
                if failed:
                    return "malformed" if self.malformed else "error_event"
        except UPSTREAM_ERRORS as exc:
            return "idle_timeout" if type(exc) is TimeoutError else "connection"
        return None if tracker.done else "ended_early"


async def open_upstream(
    client: aiohttp.ClientSession,
    endpoint: str,
    path: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    timeout: float,
    method: str = "POST",
) -> aiohttp.ClientResponse:
    """Send the request (`headers` as the replica gets them, headers.to_replica()); the
    response with its headers, its body still to read. UpstreamTimeout when it has not
    started answering within `timeout`. Header values pass as received (latin-1, as HTTP
    carries them)."""
    forwarded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    send = client.request(method, f"http://{endpoint}{path}", data=body, headers=forwarded)
    try:
        return await asyncio.wait_for(send, timeout)
    except TimeoutError as exc:
        if isinstance(exc, aiohttp.ClientError):  # aiohttp's own connect timeout: a retry
            raise
        raise UpstreamTimeout() from None
