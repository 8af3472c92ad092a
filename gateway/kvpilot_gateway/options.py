"""`kvpilot gateway`'s flags and the settings they make. Standard library only: the CLI builds
its parser before knowing whether the gateway extra is installed."""

import argparse
import ipaddress
import os
import socket
import urllib.parse
from dataclasses import dataclass, field

from kvpilot_common import trust
from kvpilot_common.errors import ConfigError
from kvpilot_common.http.keys import Key, KeyBook
from kvpilot_common.http.limits import BODY_TIMEOUT, add_http_limit_args
from kvpilot_gateway.budget import tenant_share
from kvpilot_gateway.names import Policy, parse_reservations

ROUTING = ("prefix-load", "least-load", "round-robin")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Backends = tuple[tuple[str, tuple[str, ...]], ...]  # (served model name, its "host:port"s)


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()  # () watches every namespace
    routing: str = "prefix-load"
    load_factor: float = 1.25  # bounded load: no replica above this times the mean (plus one)
    prefix_chars: int = 1024  # how much of the prompt's start picks the replica
    max_held_per_model: int = 64
    max_held: int = 512
    hold_timeout: float = 300.0
    scrape_interval: float = 1.0
    upstream_connect_timeout: float = 5.0
    # A non-streamed completion sends nothing until it is done: the first byte may take as
    # long as the whole generation, so this bound sits above any replica's request timeout.
    upstream_timeout: float = 600.0
    upstream_idle_timeout: float = 120.0  # silence between two chunks of an answer
    retries: int = 2  # other replicas tried when one fails before answering
    max_resumes: int = 2  # times one stream may go on from another replica (resume.py)
    # Shared with the servers (kvpilot_common.trust); None: streams do not resume.
    gateway_secret: str | None = None
    gateway_id: str = "gateway"
    api_keys: KeyBook | None = None
    body_timeout: float = BODY_TIMEOUT
    # Request bodies in memory at once (being read, held for a starting model, being sent).
    max_held_bytes: int = 32 << 20
    # Of them, what one tenant may hold; None: budget.tenant_share()'s default.
    max_held_bytes_per_tenant: int | None = None
    names: Policy = field(default_factory=Policy)
    trusted_proxies: tuple[Network, ...] = ()  # whose X-Forwarded-For / Forwarded are kept
    backends: Backends = ()  # given: no Kubernetes, these servers (backends.py)


def add_gateway_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch ModelDeployments in this namespace (repeatable; default: every namespace)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="MODEL=URL[,URL...]",
        help="without Kubernetes: route MODEL to these `kvpilot serve` (or other OpenAI) "
        "servers, http://host:port each (repeatable; a model named again adds servers). "
        "No watches, no scale from zero",
    )
    parser.add_argument(
        "--backend-secret",
        action="store_true",
        help=f"the --backend servers are kvpilot servers started with the gateway's "
        f"${trust.ENV}: send it to them (tenants, mid-stream resume, tpm limits). Without this "
        "flag a gateway with that secret and --backend servers does not start: a URL names any "
        "server, and the secret would let it act as the gateway towards kvpilot's",
    )
    parser.add_argument(
        "--routing",
        choices=ROUTING,
        default="prefix-load",
        help="prefix-load: the replica that caches the prompt's start, unless it is loaded "
        "beyond --load-factor (consistent hashing with bounded load); least-load: the least "
        "loaded replica; round-robin: in turn, for comparison",
    )
    parser.add_argument(
        "--load-factor",
        type=float,
        default=1.25,
        help="with prefix-load: a replica takes a conversation only while its load stays under "
        "this times the mean load (plus one)",
    )
    parser.add_argument(
        "--prefix-chars",
        type=int,
        default=1024,
        help="characters of the prompt's start (system prompt, earlier turns) hashed for "
        "prefix affinity",
    )
    parser.add_argument(
        "--max-held-per-model",
        type=int,
        default=64,
        help="requests held for one model while it has no ready replica; more get 429",
    )
    parser.add_argument(
        "--max-held", type=int, default=512, help="requests held in all; more get 429"
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=300.0,
        help="seconds a request waits for its model to start; then 503",
    )
    parser.add_argument(
        "--max-held-bytes",
        type=int,
        default=Settings.max_held_bytes,
        help="bytes of request bodies the gateway keeps in memory at once (read, held for a "
        "starting model, or being sent); a request past it gets 429",
    )
    parser.add_argument(
        "--max-held-bytes-per-tenant",
        type=int,
        help="of --max-held-bytes, what one tenant (an API key's tenant; without keys, a "
        "client address) may hold at once, so that no tenant can starve the others; a request "
        "past it gets 429 (default: a quarter of --max-held-bytes, at least the largest body)",
    )
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=Settings.upstream_timeout,
        help="seconds a replica may take to start answering (a non-streamed completion "
        "answers when it is done); then 504",
    )
    parser.add_argument(
        "--upstream-idle-timeout",
        type=float,
        default=Settings.upstream_idle_timeout,
        help="seconds a replica may stay silent mid-answer; then the stream ends with an "
        "error event (504)",
    )
    parser.add_argument(
        "--reserve",
        action="append",
        default=[],
        metavar="PATTERN=NAMESPACE[,NAMESPACE...]",
        help="served names matching PATTERN (fnmatch: 'meta-llama/*') are served only from "
        "these namespaces; elsewhere they are ignored (repeatable)",
    )
    parser.add_argument(
        "--prefer-namespace",
        action="append",
        default=[],
        help="when models in several namespaces answer to one name, this namespace's wins "
        "(repeatable, first wins); otherwise the oldest ModelDeployment keeps the name",
    )
    parser.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="CIDR",
        help="peers whose X-Forwarded-For and Forwarded headers are kept and extended "
        "(an ingress controller's addresses); everyone else's are replaced (repeatable)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        help="seconds between reads of every replica's /metrics (load for routing)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="other replicas tried when one fails before sending its first byte",
    )
    parser.add_argument(
        "--max-resumes",
        type=int,
        default=Settings.max_resumes,
        help="times one stream whose replica breaks mid-stream may go on from another "
        f"(needs ${trust.ENV}, the servers' too; 0: never)",
    )
    parser.add_argument(
        "--api-key-file",
        help="file of API keys clients must send, a line each, with optional name= rpm= tpm= "
        "weight= (docs/gateway.md; also: KVPILOT_API_KEYS=key1,key2); reread when it changes; "
        "/health, /ready and /metrics stay open",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to let in-flight requests finish after SIGTERM; held requests get 503 "
        "at once, and whatever is still open at the end is cut",
    )
    add_http_limit_args(parser)
    parser.add_argument(
        "--gateway-id",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's name in the held-requests annotation (default: $POD_NAME, "
        "else the host name)",
    )


def _no_tokens_per_minute(keys: list[Key]) -> None:
    if any(k.tpm for k in keys):
        raise ConfigError(
            f"tpm limits in the key file need ${trust.ENV} (the servers' too): a server "
            "reports a request's tokens only to the gateway that proves itself with it"
        )


def settings(args: argparse.Namespace, api_keys: KeyBook | None) -> Settings:
    """ValueError saying which flag is wrong."""
    try:
        proxies = tuple(ipaddress.ip_network(c, strict=False) for c in args.trusted_proxy)
    except ValueError as exc:
        raise ValueError(f"--trusted-proxy: {exc}") from None
    backends = parse_backends(args.backend)
    secret = trust.secret_from_env()
    if backends and secret and not args.backend_secret:
        raise ValueError(
            f"${trust.ENV} is set and --backend servers are named: pass --backend-secret if "
            "they are kvpilot servers started with it (it is sent to each of them), or unset it"
        )
    if args.backend_secret and not (backends and secret):
        raise ValueError(f"--backend-secret sends ${trust.ENV} to --backend servers: name both")
    if api_keys and not secret:
        try:
            api_keys.require(_no_tokens_per_minute)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    if backends and args.namespace:
        raise ValueError(
            "--backend and --namespace exclude each other: without Kubernetes "
            "there is nothing to watch"
        )
    share = tenant_share(args.max_held_bytes, args.max_held_bytes_per_tenant)
    return Settings(
        backends=backends,
        namespaces=tuple(args.namespace),
        routing=args.routing,
        load_factor=args.load_factor,
        prefix_chars=args.prefix_chars,
        max_held_per_model=args.max_held_per_model,
        max_held=args.max_held,
        hold_timeout=args.hold_timeout,
        scrape_interval=args.scrape_interval,
        retries=args.retries,
        max_resumes=args.max_resumes,
        gateway_secret=secret,
        gateway_id=args.gateway_id,
        api_keys=api_keys,
        body_timeout=args.body_timeout,
        max_held_bytes=args.max_held_bytes,
        max_held_bytes_per_tenant=share,
        upstream_timeout=args.upstream_timeout,
        upstream_idle_timeout=args.upstream_idle_timeout,
        names=Policy(parse_reservations(args.reserve), tuple(args.prefer_namespace)),
        trusted_proxies=proxies,
    )


def parse_backends(values: list[str]) -> Backends:
    """`MODEL=URL[,URL...]` values as (model, ("host:port", ...)) in the order first named.
    ValueError saying which value is wrong: only http:// URLs of a host and port, nothing
    after them (the gateway sends the request's own path)."""
    found: dict[str, list[str]] = {}
    for value in values:
        model, sep, urls = value.partition("=")
        if not sep or not model or not urls:
            raise ValueError(f"--backend {value!r}: expected MODEL=URL[,URL...]")
        for url in urls.split(","):
            endpoint = _endpoint(url.strip())
            if endpoint is None:
                raise ValueError(
                    f"--backend {value!r}: {url!r} is not http://host:port (no path, query, "
                    "user or https: put a TLS proxy in front of the gateway instead)"
                )
            servers = found.setdefault(model, [])
            if endpoint not in servers:
                servers.append(endpoint)
    return tuple((model, tuple(servers)) for model, servers in found.items())


def _endpoint(url: str) -> str | None:
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    plain = not (parts.path.strip("/") or parts.query or parts.fragment or parts.username)
    if parts.scheme != "http" or not parts.hostname or port is None or not plain:
        return None
    return parts.netloc
