"""The tokens a request costs its tenant's tokens per minute (kvpilot_common.http.rate_limit).

A replica reports a forwarded request's tokens (kvpilot_common.trust): a whole answer in a
header, which the client does not see; a stream in a comment before its [DONE], which clients
skip. A resumed stream's last replica reports the whole answer's, so the last report counts.

Those reports come at the end, so the gateway also reserves a request's tokens when it routes
it (estimate(): its prompt, a token per four bytes of body, and what `n` x `max_tokens` lets
it generate; without `max_tokens`, a chat may run to the context its replicas report) and
settles the reservation once, to the report or, without one, to an estimate:
a stream's relayed events, each about a token. A tenant's concurrent requests can then
overdraw its limit by about one request's reservation, not by as many answers as it sends at
once. A request whose client leaves before the replica's answer begins still costs what the
replica generated: the gateway keeps the request open until the answer's headers, which carry
the count of a whole answer (a stream's come after its first token and are closed at once).
"""

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from starlette.responses import Response

from kvpilot_common import trust
from kvpilot_common.http.auth import Caller
from kvpilot_common.http.errors import error_response
from kvpilot_common.http.rate_limit import RateLimits, Verdict, refusal_headers
from kvpilot_gateway.target import Target

_HEADER = trust.USAGE_HEADER.encode()
_MARK = b": " + trust.USAGE_COMMENT.encode() + b" "
_EVENT = b"data: {"
_KEEP = len(_MARK) + 24  # a report split across two reads is still found
# /v1/completions without max_tokens: OpenAI's default, and the server's.
COMPLETION_DEFAULT_TOKENS = 16
# A chat without max_tokens may run to the model's context: reserved as that, from what its
# replicas report (load.py). Before any has been scraped (a model woken from zero), this
# instead: too little only loosens the bound on a tenant's overdraw for that request (the
# report settles the charge); too much would refuse concurrent chats that the limit allows.
UNCAPPED_TOKENS = 1024
MAX_CHOICES = 16  # a server refuses more (docs/limits.md)
_SETTLING: set[asyncio.Task] = set()  # the waits for answers whose clients left


@dataclass(frozen=True)
class Cost:
    prompt: int  # the prompt's tokens, about: one per four bytes of body
    reserved: int  # the prompt's and what the answer may add


def estimate(target: Target, path: str, context: int = 0) -> Cost:
    """What a request may cost: its prompt, a token per four bytes of body, and what its top
    level's `n` and `max_tokens` let it generate, as routing's parse found them."""
    prompt = len(target.body) // 4
    if path.endswith("/embeddings"):  # an embedding's input is all it costs
        return Cost(prompt, prompt)
    fields = dict(target.lengths)
    n = fields.get("n")
    choices = min(n, MAX_CHOICES) if type(n) is int and n > 0 else 1
    # Chat, Responses and Messages: absent, the answer may run to the context.
    chat = path.endswith(("/chat/completions", "/responses", "/messages"))
    bound = fields.get("max_completion_tokens") or fields.get("max_output_tokens")
    cap = (bound if chat else None) or fields.get("max_tokens")
    if type(cap) is not int or cap < 1:  # absent or null: the server's default
        uncapped = chat or "max_tokens" in fields  # a completion's null: up to the context
        cap = (context or UNCAPPED_TOKENS) if uncapped else COMPLETION_DEFAULT_TOKENS
    return Cost(prompt, prompt + choices * cap)


class Reservation:
    """One request's tokens: `cost.reserved` taken from its tenant's bucket when it was routed
    (RateLimits.reserve), settled once to what it cost. A response that takes it over (the
    relay, or the wait for an answer) settles it; else release() gives it back."""

    def __init__(self, charge: Callable[[int], None], cost: Cost) -> None:
        self.charge, self.cost = charge, cost
        self.taken = False
        self._settled = False

    def settle(self, tokens: int) -> None:
        if not self._settled:
            self._settled = True
            self.charge(tokens - self.cost.reserved)  # negative: some given back

    def keep(self) -> None:
        """What it cost is unknown: the reservation, which bounds it, stands."""
        self.settle(self.cost.reserved)

    def release(self) -> None:
        """The request ends here, no replica having answered it."""
        if not self.taken:
            self.settle(0)


def reserve(
    limits: RateLimits, who: Caller, target: Target, path: str, context: int = 0
) -> Reservation | Response:
    """The request's tokens taken from its tenant's bucket, or the 429 that refuses it when
    the requests admitted with it have taken what the bucket held."""
    assert who.charge is not None
    cost = estimate(target, path, context)
    wait = limits.reserve(who.tenant, cost.reserved)
    if wait is None:
        return Reservation(who.charge, cost)
    return error_response(
        429,
        f"Rate limit reached for {who.tenant} on tokens per minute: retry in {wait:.3g} s",
        headers=refusal_headers(Verdict(wait, "tokens")),
    )


def settle_when_answered(
    pending: "asyncio.Future[aiohttp.ClientResponse]",
    reservation: Reservation,
    done: Callable[[], None],
) -> None:
    """The client left before the replica answered. Closing the request now would make the
    replica stop, but also never tell what it generated, and leaving early would dodge the
    limit; so the request runs on (within the upstream timeout) until the answer's headers,
    which the gateway then reads for the count and closes. The replica does no more than had
    the client stayed, and the tenant pays for it."""
    reservation.taken = True

    async def wait() -> None:
        try:
            upstream = await pending
        except asyncio.CancelledError:  # the gateway is stopping
            reservation.keep()
            raise
        except Exception:  # timed out or failed: what it generated is unknown
            reservation.keep()
            return
        finally:
            done()
        tap = UsageTap()
        tap.headers(upstream.raw_headers)
        streamed = upstream.headers.get("content-type", "").startswith("text/event-stream")
        upstream.close()  # a stream's replica stops at its first token
        if tap.tokens is not None:
            reservation.settle(tap.tokens)
        elif streamed or upstream.status != 200:
            reservation.settle(reservation.cost.prompt)
        else:
            reservation.keep()

    task = asyncio.ensure_future(wait())
    _SETTLING.add(task)  # a strong reference until it ends
    task.add_done_callback(_SETTLING.discard)


class UsageTap:
    """The report in a response's headers or stream, and the stream's events meanwhile."""

    def __init__(self) -> None:
        self.tokens: int | None = None
        self.events = 0  # data events seen: about a token each
        self._tail = b""

    def headers(self, raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The response's headers without the report, which it takes."""
        kept = []
        for name, value in raw:
            if name.lower() == _HEADER:
                self._take(value)
            else:
                kept.append((name, value))
        return kept

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        # Those wholly in the tail were counted with the read before.
        self.events += data.count(_EVENT, max(0, len(self._tail) - len(_EVENT) + 1))
        start = data.rfind(_MARK)
        if start >= 0 and (end := data.find(b"\n", start)) >= 0:
            self._take(data[start + len(_MARK) : end])
        self._tail = data[-_KEEP:]

    def _take(self, value: bytes) -> None:
        with contextlib.suppress(ValueError):  # not a replica of ours: nothing is charged
            self.tokens = max(0, int(value.strip()))
