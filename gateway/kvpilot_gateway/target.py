"""What routing needs of a request body, and nothing else: the model it names, the prefix key
that picks a replica, and the bytes to forward.

Parsed in full, a body costs many times its size: a 4 MiB body of small JSON objects is about
100 MiB of Python objects (pydantic-core's parser, which the server uses, builds about 65 MiB
even when told to ignore every field). So the gateway parses with the standard library's C
scanner and keeps, of every object, only the keys routing reads: a body of small objects costs
a few MiB while it is parsed, and nothing once the Target is made (a request held while its
model starts keeps only the Target, whose body is the raw bytes). Arrays and scalars cannot be
hooked that way: an array of a million empty arrays still costs about 25x its bytes while it is
parsed. So parse_cost() estimates, from counts of brackets and commas, what the parse will
build, and the body budget lends it for the parse (budget.py): a body
whose parse alone would exceed the whole budget is refused (benchmarks/gateway_attacks.py
measures both shapes).

What the server's parser refuses is refused here too, with 400 before routing, rather than
failing later as a 500 (hashing a lone surrogate) or reaching a replica: bytes that are not
UTF-8, lone surrogate escapes, nesting past the interpreter's recursion limit, NaN and
Infinity.
"""

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from kvpilot_common import stored_ids
from kvpilot_common.errors import InvalidRequestError
from kvpilot_common.http.limits import MAX_BODY_BYTES
from kvpilot_gateway import resume
from kvpilot_gateway.balance import prefix_key

# A replica reads bodies up to MAX_BODY_BYTES, and the gateway appends fields of its own (the
# served name, return_token_ids: resume.with_fields()): a client's body leaves them this much room,
# so that what the client could send is what the replica accepts.
FORWARDING_ROOM = 1 << 10
MAX_CLIENT_BODY_BYTES = MAX_BODY_BYTES - FORWARDING_ROOM
CONTINUE = "kvpilot_continue"  # the gateway's own field: a takeover of a broken stream
# What a request may generate, for its tenant's tokens per minute (usage.estimate()).
LENGTH_KEYS = ("n", "max_tokens", "max_completion_tokens", "max_output_tokens")
PREVIOUS = "previous_response_id"  # the Responses API's continuation of a stored response

# The keys prefix_key() and the model lookup read, at any depth; every other key is dropped as
# its object is parsed.
ROUTING_KEYS = frozenset(
    {"model", "messages", "prompt", "role", "content", "type", "text"}
    | {"stream", "n", "return_token_ids"}  # whether a stream can resume elsewhere (resume.py)
    | {CONTINUE}  # refused from a client
    | {PREVIOUS}  # a stored conversation's replica (stored.py)
    | set(LENGTH_KEYS)
)
# A \uD800-\uDFFF escape whose backslash is not itself escaped; group 1: its four hex digits.
_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


@dataclass(frozen=True)
class Target:
    model: str  # as the client named it
    key: bytes | None  # prefix_key() of the body; None without prefix routing
    body: bytes  # what the replica gets
    resumable: bool = False  # a stream of one choice: it can go on from another replica
    token_ids: bool = False  # the client asked for token ids itself (return_token_ids)
    # The top level's LENGTH_KEYS as the client sent them (absent: not there): read by the one
    # parse routing makes, so that a tokens limit parses nothing again.
    lengths: tuple[tuple[str, object], ...] = ()
    # A continuation of a stored response: the tag of the replica that holds it
    # (kvpilot_common.stored_ids); None for any other request.
    pinned: str | None = None


# Bytes the parse builds, at most, per array (a list and its slot), per object (cut to None by
# the hook, with its pairs' transient list), per scalar array element (a short string is the
# dearest: its object and its slot) and per element's slot, measured on CPython 3.11 with
# bodies made of nothing else (benchmarks/gateway_attacks.py's shapes among them).
ARRAY_BYTES, OBJECT_BYTES, SCALAR_BYTES, SLOT_BYTES = 96, 16, 80, 8


def parse_cost(body: bytes) -> int:
    """About how many bytes parse() will build for this body, at most, from byte counts (C
    speed, nothing built): commas part array elements, except those between an object's keys
    (a key is a string before a colon). What strings hold counts too, so it overestimates
    (emptying the strings first would cost as much memory as the parse); that errs only on
    prompts of megabytes of dense JSON text, which no model's context holds anyway."""
    arrays, objects = body.count(b"["), body.count(b"{")
    elements = body.count(b",") - max(0, body.count(b'":') - objects)
    scalars = max(0, elements - arrays - objects)
    return (
        ARRAY_BYTES * arrays
        + OBJECT_BYTES * objects
        + SCALAR_BYTES * scalars
        + SLOT_BYTES * max(0, elements)
    )


def _routing_keys(pairs: list[tuple[str, Any]]) -> dict | None:
    return {k: v for k, v in pairs if k in ROUTING_KEYS} or None


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _check_surrogates(body: bytes) -> None:
    """Every surrogate escape is half of a pair: a high one (D800-DBFF) right before a low one
    (DC00-DFFF). Rare in bodies, so the scan is one C regex search."""
    expect_low_at = None
    for match in _SURROGATE.finditer(body):
        unit = int(match.group(1), 16)
        start = match.end() - 6  # the backslash of this escape
        if unit >= 0xDC00:
            if start != expect_low_at:
                raise ValueError("a lone low surrogate escape")
            expect_low_at = None
            continue
        if expect_low_at is not None:
            raise ValueError("a high surrogate escape without its low half")
        expect_low_at = match.end()
    if expect_low_at is not None:
        raise ValueError("a high surrogate escape without its low half")


def parse(body: bytes, prefix_chars: int | None) -> Target:
    """`prefix_chars`: how much of the prompt's start keys the request (None: no key)."""
    try:
        _check_surrogates(body)
        parsed = json.loads(
            body.decode("utf-8"), object_pairs_hook=_routing_keys, parse_constant=_no_constants
        )
    except RecursionError:
        raise InvalidRequestError("Request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError say where
        raise InvalidRequestError(f"Request body is not valid JSON: {exc}") from None
    if parsed is None and body.lstrip()[:1] == b"{":
        parsed = {}  # an object with none of the routing keys
    if not isinstance(parsed, dict):
        raise InvalidRequestError("Request body must be a JSON object")
    if CONTINUE in parsed:
        # The gateway sends its secret with every request: passed on, the client's own
        # continuation would be taken as the gateway's (token ids and an id it chose).
        raise InvalidRequestError(
            f"{CONTINUE} is the gateway's own field, for a stream it moves to another replica; "
            "a client cannot send it",
            CONTINUE,
        )
    model = parsed.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: a model name is required", "model")
    key = prefix_key(parsed, prefix_chars) if prefix_chars is not None else None
    resumable = parsed.get("stream") is True and parsed.get("n", 1) in (1, None)
    lengths = tuple((k, parsed[k]) for k in LENGTH_KEYS if k in parsed)
    token_ids = parsed.get("return_token_ids") is True
    pinned = stored_ids.tag_of(parsed.get(PREVIOUS))
    return Target(model, key, body, resumable, token_ids, lengths, pinned)


def for_replica(target: Target, served: str, resumable: bool) -> Target:
    """The request as its replica gets it: under the name the replica answers to (a
    namespace-qualified request: the replica knows only its served name) and, for a stream that
    may resume elsewhere, asking for token ids (resume.py). The fields are appended by
    resume.with_fields(), in one copy, not the body parsed and written again (which cost twice
    a body's size in Python objects, and grew a body of non-ASCII text past the replica's limit
    by escaping it); the client's bytes are dropped with the old Target."""
    fields: dict[str, object] = {} if target.model == served else {"model": served}
    if resumable:
        fields["return_token_ids"] = True
    body = resume.with_fields(target.body, fields) if fields else target.body
    return dataclasses.replace(target, model=served, body=body, resumable=resumable)
