"""Which headers cross the gateway (headers.py): hop-by-hop ones and those `Connection` names
never, a client's forwarding claims only from a trusted proxy."""

import ipaddress

from kvpilot_gateway.headers import end_to_end, to_replica

PROXY = (ipaddress.ip_network("10.0.0.0/8"),)
SENT = [
    (b"host", b"gw.example"),
    (b"connection", b"keep-alive, X-Secret"),
    (b"x-secret", b"hop only"),
    (b"te", b"trailers"),
    (b"authorization", b"Bearer k"),
    (b"x-forwarded-for", b"6.6.6.6"),
    (b"forwarded", b"for=6.6.6.6"),
    (b"x-real-ip", b"6.6.6.6"),
]


def _names(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [k for k, _ in headers]


def test_hop_by_hop_and_connection_named_headers_never_cross():
    assert end_to_end(SENT) == [
        (b"authorization", b"Bearer k"),
        (b"x-forwarded-for", b"6.6.6.6"),
        (b"forwarded", b"for=6.6.6.6"),
        (b"x-real-ip", b"6.6.6.6"),
    ]
    response = [(b"Connection", b"X-Hop"), (b"X-Hop", b"1"), (b"Content-Type", b"text/plain")]
    assert end_to_end(response) == [(b"Content-Type", b"text/plain")]


def test_an_untrusted_clients_forwarding_claims_are_replaced():
    out = dict(to_replica(SENT, "192.0.2.7", "http", PROXY))
    assert out[b"x-forwarded-for"] == b"192.0.2.7"
    assert out[b"forwarded"] == b'for=192.0.2.7;proto=http;host="gw.example"'
    assert out[b"x-forwarded-host"] == b"gw.example" and out[b"x-forwarded-proto"] == b"http"
    assert b"x-real-ip" not in out and b"x-secret" not in out
    assert _names(to_replica(SENT, "192.0.2.7", "http", ())).count(b"x-forwarded-for") == 1


def test_a_trusted_proxys_chain_is_kept_and_extended():
    sent = [*SENT, (b"x-forwarded-for", b"7.7.7.7"), (b"x-forwarded-proto", b"https")]
    out = dict(to_replica(sent, "10.1.2.3", "http", PROXY))
    assert out[b"x-forwarded-for"] == b"6.6.6.6, 7.7.7.7, 10.1.2.3"
    assert out[b"x-forwarded-proto"] == b"https"
    assert out[b"forwarded"] == b'for=6.6.6.6, for=10.1.2.3;proto=http;host="gw.example"'
    ipv6 = dict(to_replica([], "fd00::1", "http", ()))
    assert ipv6[b"forwarded"] == b'for="[fd00::1]";proto=http'
