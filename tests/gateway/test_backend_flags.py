"""--backend's values as the gateway reads them: MODEL=URL[,URL...], a model named twice gets
both lists, and anything but http://host:port is refused with the value named; --namespace
beside it is refused too (without Kubernetes there is nothing to watch)."""

import argparse
import os

import pytest

from kvpilot_gateway.options import add_gateway_args, parse_backends, settings


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    return parser.parse_args(argv)


def test_models_keep_their_servers_in_the_order_named():
    assert parse_backends(
        ["a=http://127.0.0.1:8001,http://127.0.0.2:8001", "b=http://[::1]:9000/", "a=http://h:1"]
    ) == (
        ("a", ("127.0.0.1:8001", "127.0.0.2:8001", "h:1")),
        ("b", ("[::1]:9000",)),
    )
    assert parse_backends(["a=http://h:1,http://h:1"]) == (("a", ("h:1",)),)
    # A served name may hold '/' (the first '=' ends it).
    assert parse_backends(["org/m=http://h:2"]) == (("org/m", ("h:2",)),)


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "=http://h:1",
        "a=",
        "a=h:1",
        "a=http://h",
        "a=https://h:1",
        "a=http://h:1/v1",
        "a=http://h:1?x=1",
        "a=http://user@h:1",
        "a=http://h:99999",
        "a=http://h:1,",
    ],
)
def test_anything_but_http_host_port_is_refused_naming_the_value(value):
    with pytest.raises(ValueError, match="--backend"):
        parse_backends([value])


def test_backends_and_namespaces_exclude_each_other():
    made = settings(_args("--backend", "m=http://127.0.0.1:8000"), [])
    assert made.backends == (("m", ("127.0.0.1:8000",)),) and made.namespaces == ()
    with pytest.raises(ValueError, match="--backend and --namespace"):
        settings(_args("--backend", "m=http://127.0.0.1:8000", "--namespace", "x"), [])


def test_tokens_per_minute_limits_need_the_gateway_secret(monkeypatch):
    from kvpilot_common import trust
    from kvpilot_common.http.keys import KeyBook

    book = KeyBook(env_value="sk-alpha-1, sk-bravo-1 tpm=100")
    monkeypatch.delenv(trust.ENV, raising=False)
    with pytest.raises(ValueError, match=f"tpm limits in the key file need \\${trust.ENV}"):
        settings(_args("--backend", "a=http://h:1"), book)
    monkeypatch.setenv(trust.ENV, "s")
    backend = ("--backend", "a=http://h:1", "--backend-secret")
    assert settings(_args(*backend), book).gateway_secret == "s"
    monkeypatch.delenv(trust.ENV)
    assert settings(_args("--backend", "a=http://h:1"), KeyBook.of(["sk-alpha-1"])).api_keys


def test_a_reload_that_adds_tpm_without_the_secret_is_refused(tmp_path, monkeypatch):
    from kvpilot_common import trust
    from kvpilot_common.http import keys

    monkeypatch.delenv(trust.ENV, raising=False)
    monkeypatch.setattr(keys, "RECHECK_S", 0.0)
    path = tmp_path / "keys.txt"
    path.write_text("sk-alpha-1 name=a rpm=5\n")
    book = keys.KeyBook(str(path))
    settings(_args("--backend", "a=http://h:1"), book)
    path.write_text("sk-alpha-1 name=a rpm=5 tpm=100\nsk-bravo-1 name=b\n")
    os.utime(path, ns=(1, 1))
    assert (
        book.match(b"sk-alpha-1").tpm is None and book.match(b"sk-bravo-1") is None
    )  # kept as it was


def test_the_secret_goes_to_backends_only_when_said(monkeypatch):
    """A URL names any server, kvpilot's or not: the gateway's secret would let it pass for
    the gateway towards kvpilot's servers."""
    from kvpilot_common import trust

    monkeypatch.setenv(trust.ENV, "s")
    with pytest.raises(ValueError, match="pass --backend-secret if they are kvpilot servers"):
        settings(_args("--backend", "a=http://h:1"), [])
    monkeypatch.delenv(trust.ENV)
    with pytest.raises(ValueError, match="--backend-secret sends"):
        settings(_args("--backend", "a=http://h:1", "--backend-secret"), [])
