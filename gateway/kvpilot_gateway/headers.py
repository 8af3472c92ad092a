"""Which headers cross the gateway, each way. Pure.

Hop-by-hop headers belong to one connection (RFC 9110 7.6.1): the fixed list, and every header
the `Connection` header names, are never forwarded, in either direction. A client's
`X-Forwarded-*` and `Forwarded` are what it claims about itself: kept (and extended) only from a
trusted proxy (an ingress controller's addresses, --trusted-proxy), otherwise replaced with what
the gateway saw, so a replica's logs and rate limits see the real peer.
"""

import ipaddress
import re
from collections.abc import Sequence

from starlette.requests import Request

from kvpilot_common import stored_ids, trust
from kvpilot_common.http.auth import Caller, caller
from kvpilot_common.http.limits import MAX_HEADER_BYTES
from kvpilot_gateway.options import Network, Settings

Headers = list[tuple[bytes, bytes]]
# What a replica's header limit leaves for the headers, below its request line's room.
MAX_FORWARDED_BYTES = MAX_HEADER_BYTES - (4 << 10)

HOP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",  # the hop's own, as is the length: aiohttp sets both
        b"content-length",
    }
)
_TRUSTED = frozenset(h.encode() for h in trust.HEADERS)
# A Host the gateway repeats in X-Forwarded-Host and Forwarded: a name or an address, and a
# port (RFC 3986's reg-name, narrowed to DNS's letters; an IPv6 literal in brackets).
_HOST = re.compile(rb"(?:[A-Za-z0-9_.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
FORWARDING = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-real-ip"}
)


def end_to_end(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """Without the hop-by-hop ones, the fixed list's and those `Connection` names."""
    named = {
        token.strip().lower()
        for k, v in headers
        if k.lower() == b"connection"
        for token in v.split(b",")
    }
    return [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS and k.lower() not in named]


def trusted(peer: str | None, proxies: Sequence[Network]) -> bool:
    if peer is None or not proxies:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in proxies)


def _node(peer: str) -> str:
    """RFC 7239's node: IPv6 in brackets and quotes."""
    return f'"[{peer}]"' if ":" in peer else peer


def to_replica(
    headers: Sequence[tuple[bytes, bytes]],
    peer: str | None,
    scheme: str,
    proxies: Sequence[Network],
) -> Headers:
    """The request headers the replica gets from a client at `peer`."""
    kept = end_to_end(headers)
    from_proxy = trusted(peer, proxies)
    claimed: dict[bytes, bytes] = {}
    for k, v in kept if from_proxy else ():
        if k.lower() in FORWARDING:  # repeated headers are one list (RFC 9110 5.3)
            before = claimed.get(k.lower())
            claimed[k.lower()] = before + b", " + v if before else v
    # A client's gateway secret and tenant never pass: the gateway sends its own (proxy.py).
    out = [(k, v) for k, v in kept if k.lower() not in FORWARDING and k.lower() not in _TRUSTED]
    host = next((v for k, v in headers if k.lower() == b"host"), b"")
    if not _HOST.fullmatch(host):
        host = b""  # not a host: a client's text, not copied twice into what the replica reads
    peer = peer or "unknown"
    chain = claimed.get(b"x-forwarded-for")
    out.append((b"x-forwarded-for", (chain + b", " if chain else b"") + peer.encode()))
    proto = claimed.get(b"x-forwarded-proto") or scheme.encode()
    out.append((b"x-forwarded-proto", proto))
    forwarded_host = claimed.get(b"x-forwarded-host") or host
    if forwarded_host:
        out.append((b"x-forwarded-host", forwarded_host))
    element = f"for={_node(peer)};proto={scheme}".encode()
    if host:
        element += b';host="' + host + b'"'
    earlier = claimed.get(b"forwarded")
    out.append((b"forwarded", (earlier + b", " if earlier else b"") + element))
    return out


def size(headers: Headers) -> int:
    """Bytes of the header lines, as the replica's limit counts them (name, ": ", value, CRLF)."""
    return sum(len(k) + len(v) + 4 for k, v in headers)


def too_large(headers: Headers) -> str | None:
    """Why the replica would refuse these headers (431, in plain text: the gateway says it
    first, in the API's shape); None when they fit."""
    if size(headers) <= MAX_FORWARDED_BYTES:
        return None
    return (
        "Request headers are too large to forward to the model: with the gateway's own, "
        f"{size(headers)} bytes, more than {MAX_FORWARDED_BYTES}"
    )


def of_request(request: Request, settings: Settings) -> Headers:
    """What a replica gets of this client request's headers: the end-to-end ones, what the
    gateway saw of the client, and, with the secret, what the gateway vouches for. Taken
    before the body is read: nothing a chunked body's trailer says is forwarded."""
    client = request.scope.get("client")
    sent = to_replica(
        list(request.headers.raw),
        client[0] if client else None,
        request.url.scheme,
        settings.trusted_proxies,
    )
    if settings.gateway_secret:
        sent += from_gateway(caller(request), settings.gateway_secret)
    return sent


def from_gateway(caller: Caller, secret: str) -> Headers:
    """What the replica believes because the gateway says so (kvpilot_common.trust): the
    request's tenant, for the engine's fairness, proven by the shared secret."""
    return [
        (trust.HEADER.encode(), secret.encode()),
        (trust.TENANT_HEADER.encode(), caller.tenant.encode()),
        (trust.WEIGHT_HEADER.encode(), repr(caller.weight).encode()),
    ]


def for_endpoint(sent: Headers, endpoint: str, secret: str | None) -> Headers:
    """`sent` as the replica at `endpoint` gets them: told, where the gateway proves itself, the
    tag it is known by, which it puts in the ids of the responses it stores (stored.py)."""
    if not secret:
        return sent
    return [*sent, (trust.REPLICA_HEADER.encode(), stored_ids.replica_tag(endpoint).encode())]
