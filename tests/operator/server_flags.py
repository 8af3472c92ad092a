"""What the server's own command line makes of the args render() gives a pod: the real parser
(kvpilot_common.cli), stopped before the command runs. Shared by the render tests."""

import argparse

import pytest

from kvpilot_common import cli


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def server_reads(args: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The namespace the server's parser makes of `args`, without running the command."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        raise _Parsed(parse(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as parsed:
        cli.main(args)
    return parsed.value.namespace
