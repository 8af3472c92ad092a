"""The tokens a replica reports for a request the gateway forwarded (kvpilot_common.trust):
what the gateway charges to the tenant's tokens per minute. A whole answer reports them in a
header, which the client does not see; a stream in a comment before its [DONE], which clients
skip. A resumed stream's last replica reports the whole answer's, so the last report counts.
Without a report (the client left first), the events relayed stand for the output's tokens."""

import contextlib

from kvpilot_common import trust

_HEADER = trust.USAGE_HEADER.encode()
_MARK = b": " + trust.USAGE_COMMENT.encode() + b" "
_EVENT = b"data: {"
_KEEP = len(_MARK) + 24  # a report split across two reads is still found


class UsageTap:
    def __init__(self) -> None:
        self.tokens: int | None = None
        self.events = 0  # data events seen: about a token each
        self._tail = b""

    def headers(self, raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
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
