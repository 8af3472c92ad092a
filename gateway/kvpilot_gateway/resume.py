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
"""

import json
from dataclasses import dataclass, field

# Error events a replica sends when it, not the request, failed: another replica may succeed.
SERVER_SIDE = frozenset({"internal_server_error", "service_unavailable", "bad_gateway"})
DONE = b"data: [DONE]"


def with_fields(body: bytes, fields: dict) -> bytes:
    """The JSON object `body` with `fields` added after its own: appended as text, not parsed
    and written again (a body of megabytes costs nothing more), and a key the client sent too
    is overridden (the server's parser keeps the last of a repeated key)."""
    stripped = body.rstrip()
    if not stripped.endswith(b"}") or not fields:
        raise ValueError("not a JSON object")
    return stripped[:-1] + b"," + json.dumps(fields)[1:-1].encode() + b"}"


@dataclass
class Tracker:
    """The events of one resumable stream, from one replica after another."""

    keep_ids: bool  # the client asked for token ids itself: relay them
    token_ids: list[int] = field(default_factory=list)  # what the client has received
    id: str | None = None
    created: int | None = None
    done: bool = False  # [DONE] relayed: the stream is complete
    _pending: bytes = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(the whole events of `data` to relay, whether the replica sent a server-side error,
        which is not relayed: the stream goes on elsewhere)."""
        self._pending += data
        *events, self._pending = self._pending.split(b"\n\n")
        out: list[bytes] = []
        for event in events:
            if self.done or not event.strip():
                continue
            relayed, failed = self._event(event)
            if failed:
                return b"".join(out), True
            out.append(relayed + b"\n\n")
        return b"".join(out), False

    def restart(self) -> None:
        """A new replica: what the last left half-sent is dropped."""
        self._pending = b""

    def continuation(self) -> dict:
        """The fields that continue this stream on another replica."""
        resumed = {"token_ids": self.token_ids, "id": self.id, "created": self.created}
        return {"return_token_ids": True, "kvpilot_continue": resumed}

    def _event(self, event: bytes) -> tuple[bytes, bool]:
        if event.startswith(DONE):
            self.done = True
            return event, False
        if not event.startswith(b"data: "):
            return event, False  # a comment or another field: as is
        body = json.loads(event[6:])
        error = body.get("error")
        if isinstance(error, dict):
            return event, error.get("code") in SERVER_SIDE
        self.id = body.get("id", self.id)
        self.created = body.get("created", self.created)
        for choice in body.get("choices") or ():
            self.token_ids += choice.get("token_ids") or ()
            if not self.keep_ids:
                choice.pop("token_ids", None)
        if self.keep_ids:
            return event, False
        body.pop("prompt_token_ids", None)
        return b"data: " + json.dumps(body).encode(), False
