"""The HTTP limits every kvpilot listener enforces on its clients, `kvpilot serve` and
`kvpilot gateway` alike: one set of numbers and flags, so the front door is never looser than
the server behind it. Standard library only: the CLI builds both parsers before knowing which
extras are installed. The protocol that enforces the header limits is http/protocol.py,
the body limits http/body.py."""

import argparse

MAX_HEADER_BYTES = 64 << 10  # request line plus headers; Go and nginx allow less by default
MAX_BODY_BYTES = 4 << 20
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0


def add_http_limit_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=HEADER_TIMEOUT,
        help="seconds a client may take to send a request's line and headers; then 408 and "
        "the connection is closed (a slow client must not hold a connection forever)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=BODY_TIMEOUT,
        help="seconds a client may stay silent while sending a request body; then 408",
    )
