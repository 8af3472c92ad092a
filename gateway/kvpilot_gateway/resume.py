"""Mid-stream failover: a stream whose replica breaks before its end goes on from another one,
and the client sees one uninterrupted stream.

The gateway asks every resumable stream (a streamed completion of one choice) for its token ids
(`return_token_ids`, vLLM's field), and keeps, as events pass, the ids the client has received
and the response's id and created. The events it relays lose those fields again unless the
client asked for them. When the stream breaks (the connection fails or ends before `[DONE]`,
the replica goes silent past the idle timeout, or it sends a server-side error event: a drain
past its timeout, an engine failure), the gateway sends the same request to another replica with
`kvpilot_continue` (those ids, that id and created) and the gateway secret
(kvpilot_common.trust). That replica prefills prompt and output, samples what the first
would have sampled next (a seeded draw depends on the seed and the position only) and streams the
rest with the same id, without a second role chunk, ending with usage counted over the whole
answer. Only whole events are relayed, so a break never leaves half an event at the client.

A replica is not trusted to be well formed: a broken or hostile one must not cost the gateway
unbounded memory or time, nor crash the relay. An event longer than MAX_EVENT_BYTES, or one that
is not the JSON a server sends, ends the stream (Malformed: the relay sends an error event), and
the ids kept for a continuation stop at what a continuation can carry (`room`): past it the
stream is relayed on, without resumption.
"""

import json
from array import array
from dataclasses import dataclass, field
from typing import Any

from kvpilot_common.http.limits import MAX_BODY_BYTES

# Error events a replica sends when it, not the request, failed: another replica may succeed.
SERVER_SIDE = frozenset({"internal_server_error", "service_unavailable", "bad_gateway"})
DONE = b"data: [DONE]"
# The longest event the gateway buffers to relay whole. A kvpilot server's longest is a stream's
# first chunk with token ids, which lists the prompt's ids, about 7 bytes each: 4 MiB holds those
# of a prompt of some 600K tokens (a longer prompt's resumable stream ends with the error event).
# So the buffer, and the parse of what it holds (about 5x its bytes), stay bounded per stream.
MAX_EVENT_BYTES = MAX_BODY_BYTES
MAX_ID_CHARS = 256  # a response id is a short name (`chatcmpl-` and 32 hex digits on ours)
_TOKEN_ID_LIMIT = 1 << 32  # what array("I") holds; every vocabulary is far smaller


class Malformed(ValueError):
    """The replica sent what no kvpilot server sends: the stream cannot go on from it.
    `relayed`: the whole events before the bad one, which the client still gets."""

    def __init__(self, reason: str, relayed: bytes = b"") -> None:
        super().__init__(reason)
        self.relayed = relayed


def with_fields(body: bytes, fields: dict) -> bytes:
    """The JSON object `body` with `fields` added after its own: appended as text, not parsed
    and written again (a body of megabytes costs nothing more), and a key the client sent too
    is overridden (the server's parser keeps the last of a repeated key)."""
    stripped = body.rstrip()
    if not stripped.endswith(b"}") or not fields:
        raise ValueError("not a JSON object")
    return stripped[:-1] + b"," + json.dumps(fields)[1:-1].encode() + b"}"


def room(body: bytes) -> int:
    """Bytes of token ids a continuation of a request with this body can carry: what a server
    reads, less the body and the continuation's other fields (an id, a time)."""
    return MAX_BODY_BYTES - len(body) - 2 * MAX_ID_CHARS


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


@dataclass
class Tracker:
    """The events of one resumable stream, from one replica after another."""

    keep_ids: bool  # the client asked for token ids itself: relay them
    # Bytes of ids a continuation may carry: what a server reads (its body limit) less the
    # request's own body. A continuation past it would be refused (413) by every replica.
    room: int = MAX_BODY_BYTES
    token_ids: array = field(default_factory=lambda: array("I"))  # what the client has received
    id: str | None = None
    created: int | None = None
    done: bool = False  # [DONE] relayed: the stream is complete
    resumable: bool = True  # False once the ids outgrew `room`: relayed on, not resumed
    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(the whole events of `data` to relay, whether the replica sent a server-side error,
        which is not relayed: the stream goes on elsewhere). Malformed (carrying the events
        before the bad one, to relay first) when the replica sent what no server sends."""
        # Searched from where the last read left off: an endless event costs its bytes once,
        # not once per read.
        seek = max(0, len(self._pending) - 1)
        self._pending += data
        out: list[bytes] = []
        start = 0
        try:
            while (end := self._pending.find(b"\n\n", seek)) >= 0:
                event = bytes(self._pending[start:end])
                start = seek = end + 2
                if self.done or not event.strip():
                    continue
                relayed, failed = self._event(event)
                if failed:
                    return b"".join(out), True
                out.append(relayed + b"\n\n")
            if len(self._pending) - start > MAX_EVENT_BYTES:
                raise Malformed(f"an event longer than {MAX_EVENT_BYTES >> 20} MiB")
        except Malformed as exc:
            self._pending.clear()
            start = 0
            raise Malformed(str(exc), b"".join(out)) from None
        finally:
            del self._pending[:start]
        return b"".join(out), False

    def restart(self) -> None:
        """A new replica: what the last left half-sent is dropped."""
        self._pending.clear()

    def continuation(self) -> dict:
        """The fields that continue this stream on another replica."""
        ids = self.token_ids.tolist()
        resumed = {"token_ids": ids, "id": self.id, "created": self.created}
        return {"return_token_ids": True, "kvpilot_continue": resumed}

    def _event(self, event: bytes) -> tuple[bytes, bool]:
        if event.startswith(DONE):
            self.done = True
            return event, False
        if not event.startswith(b"data: "):
            return event, False  # a comment or another field: as is
        body = _parse(event[6:])
        error = body.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            return event, isinstance(code, str) and code in SERVER_SIDE
        self._identity(body)
        choices = body.get("choices", [])
        if not isinstance(choices, list):
            raise Malformed("choices that are not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise Malformed("a choice that is not an object")
            if choice.get("token_ids") is not None:
                self._keep(choice["token_ids"])
            if not self.keep_ids:
                choice.pop("token_ids", None)
        if self.keep_ids:
            return event, False
        body.pop("prompt_token_ids", None)
        return b"data: " + json.dumps(body).encode(), False

    def _identity(self, body: dict) -> None:
        """The response's id and created, which a continuation carries to the next replica."""
        id, created = body.get("id", self.id), body.get("created", self.created)
        # ASCII and short, as a server's ids are: json.dumps would write other text six bytes
        # a character, past the room a continuation leaves them.
        if id is not None and not (
            isinstance(id, str) and len(id) <= MAX_ID_CHARS and id.isascii()
        ):
            raise Malformed("an id that is not a short ASCII string")
        if created is not None and (type(created) is not int or not 0 <= created < 2**63):
            raise Malformed("a created that is not a time")
        self.id, self.created = id, created

    def _keep(self, ids: Any) -> None:
        if not isinstance(ids, list) or not all(
            type(i) is int and 0 <= i < _TOKEN_ID_LIMIT for i in ids
        ):
            raise Malformed("token ids that are not a list of token ids")
        if not self.resumable:
            return
        self.room -= sum(len(str(i)) + 2 for i in ids)  # as json.dumps writes them: "id, "
        if self.room < 0:  # no replica would read the continuation: give up on resuming
            self.resumable, self.token_ids = False, array("I")
            return
        self.token_ids.extend(ids)


def _parse(data: bytes) -> dict:
    try:
        body = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's depth
        raise Malformed("an event that is not JSON") from None
    if not isinstance(body, dict):
        raise Malformed("an event that is not a JSON object")
    return body
