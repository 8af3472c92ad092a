"""Which ready replica takes a request. Pure: no I/O, no clock.

prefix-load is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam): the start
of the prompt hashes to a point on a ring of replica points, and the first replica clockwise
whose load after this request stays within load_factor times the mean (plus one) takes it. A
conversation thus keeps hitting the replica that caches its prefix, unless that replica is
overloaded; then it spills to the next one on the ring, which is the same replica for every
request of that conversation, so the spill-over caches too.
"""

import bisect
import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot_gateway.options import ROUTING

AFFINITY, OVERFLOW, LEAST_LOAD, ROUND_ROBIN = "affinity", "overflow", "least-load", "round-robin"
REASONS = (AFFINITY, OVERFLOW, LEAST_LOAD, ROUND_ROBIN)

# Rings and turn counters are kept per endpoint set; one Balancer serves every model, so it holds
# a few sets at a time. Bounded so replicas coming and going cannot grow them without end.
_MAX_SETS = 256


def _text_of(content: Any) -> str:
    """A chat message's content: a string, or a list of parts of which the text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""  # None (an assistant turn with only tool calls) or a shape we do not know


def _prompt_text(prompt: Any) -> str:
    """A completions prompt: a string, token ids, or a batch of either (its first counts)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int) and not isinstance(first, bool):
            # Token ids: their decimal text, so equal id prefixes give equal keys.
            return " ".join(str(t) for t in prompt if isinstance(t, int))
        return _prompt_text(first)
    return ""


def prefix_key(body: dict, chars: int) -> bytes | None:
    """What identifies a conversation, utf-8, at most `chars` characters. For chat: each message's
    role and text in order, up to and including the first user message (the system prompt and
    the opening question): later turns only append to a conversation, so every turn of one
    conversation keys alike, and it is that replica whose cache holds its start. For
    completions: the start of the prompt (the first of a batch). None when there is none."""
    if isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            if not isinstance(m, dict):
                continue
            # Role and a separator go in too, so "user: ab" and "user: a" + "b" differ.
            parts.append(f"{m.get('role', '')}\x1f{_text_of(m.get('content'))}\x1e")
            if m.get("role") == "user":
                break
        text = "".join(parts)
    else:
        text = _prompt_text(body.get("prompt"))
    text = text[: max(chars, 0)]
    return text.encode("utf-8") if text else None


def _hash(data: bytes) -> int:
    # A stable hash: Python's hash() of bytes is salted per process, and every gateway replica
    # (and a restarted one) must map a conversation to the same replica.
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=_MAX_SETS)
def _ring(endpoints: frozenset[str], vnodes: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Sorted ring points and the endpoint at each. Each endpoint's points depend only on its own
    name, so adding or removing one moves only the keys that land on its points."""
    points = sorted(
        (_hash(f"{endpoint}#{i}".encode()), endpoint)
        for endpoint in endpoints
        for i in range(vnodes)
    )
    return tuple(h for h, _ in points), tuple(e for _, e in points)


@dataclass(frozen=True)
class Choice:
    endpoint: str  # "ip:port"
    reason: str  # one of REASONS, for the routing-decision metric


class Balancer:
    """One per gateway (or per model): picks among the endpoints it is given each time."""

    def __init__(self, policy: str, load_factor: float = 1.25, vnodes: int = 64) -> None:
        if policy not in ROUTING:
            raise ValueError(f"routing policy {policy!r} is not one of {', '.join(ROUTING)}")
        if load_factor < 1.0:
            # Below one the bound is under the mean load: no replica could take the request.
            raise ValueError(f"load factor must be at least 1, got {load_factor}")
        if vnodes < 1:
            raise ValueError(f"vnodes must be at least 1, got {vnodes}")
        self.policy = policy
        self.load_factor = load_factor
        self.vnodes = vnodes
        # Turns per endpoint set: with one counter for all, two models alternating requests
        # would each always land on the same replica.
        self._turns: OrderedDict[frozenset[str], int] = OrderedDict()

    def pick(
        self, endpoints: Sequence[str], load: Mapping[str, float], key: bytes | None
    ) -> Choice:
        """`load`: each endpoint's current load (missing: 0). `key`: prefix_key() of the
        request, used by prefix-load only."""
        if not endpoints:
            raise ValueError("no endpoints to pick from")
        members = frozenset(endpoints)
        if self.policy == "round-robin":
            ordered = sorted(members)
            return Choice(ordered[self._turn(members) % len(ordered)], ROUND_ROBIN)
        if self.policy == "prefix-load" and key is not None:
            return self._bounded(members, load, key)
        return self._least_load(members, load)

    def bound(self, endpoints: Sequence[str], load: Mapping[str, float]) -> int:
        """The most load a replica may have after taking one more request."""
        members = frozenset(endpoints)
        total = sum(load.get(e, 0.0) for e in members)
        return math.ceil(self.load_factor * (total + 1) / len(members))

    def _bounded(self, members: frozenset[str], load: Mapping[str, float], key: bytes) -> Choice:
        limit = self.bound(tuple(members), load)
        hashes, owners = _ring(members, self.vnodes)
        start = bisect.bisect_left(hashes, _hash(key))
        seen: set[str] = set()
        for i in range(len(hashes)):
            endpoint = owners[(start + i) % len(hashes)]
            if endpoint in seen:
                continue
            if load.get(endpoint, 0.0) + 1 <= limit:
                return Choice(endpoint, AFFINITY if not seen else OVERFLOW)
            seen.add(endpoint)
            if len(seen) == len(members):
                break
        # With whole-number loads the least loaded replica always fits the bound; fractional
        # loads (a nearly full KV cache weighs more) can leave none within it.
        return self._least_load(members, load)

    def _least_load(self, members: frozenset[str], load: Mapping[str, float]) -> Choice:
        lowest = min(load.get(e, 0.0) for e in members)
        # Ties in turn, so equally loaded replicas share instead of the first taking everything
        # between two scrapes.
        minima = sorted(e for e in members if load.get(e, 0.0) <= lowest + 1e-9)
        return Choice(minima[self._turn(members) % len(minima)], LEAST_LOAD)

    def _turn(self, members: frozenset[str]) -> int:
        turn = self._turns.pop(members, 0)
        self._turns[members] = turn + 1  # most recently used last
        while len(self._turns) > _MAX_SETS:
            self._turns.popitem(last=False)
        return turn
