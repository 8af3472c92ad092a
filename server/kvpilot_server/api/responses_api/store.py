"""Stored responses (`store: true`): what `previous_response_id`, GET and DELETE read. Held in
the replica's memory, bounded in count and bytes, the least recently used evicted first; each
visible only to the tenant whose key made it (another's id is the same 404 as an unknown one,
so ids cannot be probed). A replica's restart forgets them: a continuation then gets a 404 that
says so, never a conversation silently started over (docs/limits.md)."""

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kvpilot_common.errors import NotFoundError

MAX_RESPONSES = 1024
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Stored:
    owner: str  # the tenant
    response: dict[str, Any]  # the response object, as GET returns it
    conversation: list[dict[str, Any]]  # chat messages: every turn up to and with this answer
    items: list[dict[str, Any]]  # the request's own input items, as input_items lists them
    size: int


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._held: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    def put(
        self, owner: str, response: dict[str, Any], conversation: list[dict], items: list[dict]
    ) -> None:
        size = sum(len(json.dumps(part)) for part in (response, conversation, items))
        if size > self.max_bytes:
            return  # larger than the whole store: kept by nobody, found by nobody (a 404)
        self._drop(response["id"])
        self._held[response["id"]] = Stored(owner, response, conversation, items, size)
        self._bytes += size
        while len(self._held) > self.max_responses or self._bytes > self.max_bytes:
            self._drop(next(iter(self._held)))

    def get(self, owner: str, response_id: str, where: str = "response_id") -> Stored:
        stored = self._held.get(response_id)
        if stored is None or stored.owner != owner:
            raise NotFoundError(
                f"No stored response {response_id!r} ({where}): it was never stored (store: "
                "false), was deleted, or has left this replica's bounded store (evicted, or "
                "the replica restarted)",
                where,
            )
        self._held.move_to_end(response_id)
        return stored

    def delete(self, owner: str, response_id: str) -> None:
        self.get(owner, response_id)
        self._drop(response_id)

    def __len__(self) -> int:
        return len(self._held)

    def _drop(self, response_id: str) -> None:
        stored = self._held.pop(response_id, None)
        if stored is not None:
            self._bytes -= stored.size
