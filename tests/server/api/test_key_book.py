"""The key book (names, limits, weights, reload) and the token buckets' arithmetic: what
Retry-After and the x-ratelimit-* headers say. A settable clock stands for time."""

import logging
import os
import time

import pytest

from kvpilot_common.errors import ConfigError
from kvpilot_common.http import keys
from kvpilot_common.http.keys import KeyBook, load_key_book, parse_entry, settle
from kvpilot_common.http.rate_limit import RateLimits, duration, refusal_headers


def test_an_entry_names_its_tenant_limits_and_weight():
    key = parse_entry("sk-team-1  name=team-a rpm=60 tpm=1000 weight=2.5", "f")
    assert (key.secret, key.tenant, key.rpm, key.tpm, key.weight) == (
        b"sk-team-1",
        "team-a",
        60,
        1000,
        2.5,
    )
    (plain,) = settle([parse_entry("sk-plain-2", "f")])
    assert plain.tenant.startswith("key-") and "sk-plain-2" not in plain.tenant
    assert (plain.rpm, plain.tpm, plain.weight) == (None, None, 1.0)


def test_a_tenants_keys_share_its_settings_and_may_not_disagree():
    first, second = settle(
        [
            parse_entry("sk-team-1 name=t rpm=60 weight=2", "f"),
            parse_entry("sk-team-2 name=t tpm=9", "f"),
        ]
    )
    assert (first.rpm, first.tpm, first.weight) == (second.rpm, second.tpm, second.weight)
    assert (second.rpm, second.tpm, second.weight) == (60, 9, 2.0)
    with pytest.raises(ConfigError, match="tenant t: its keys set rpm to 60 and 61"):
        settle(
            [
                parse_entry("sk-team-1 name=t rpm=60", "f"),
                parse_entry("sk-team-2 name=t rpm=61", "f"),
            ]
        )


@pytest.mark.parametrize(
    "entry, words",
    [
        ("sk-entry rpm=0", "positive"),
        ("sk-entry weight=-1", "from 0.01 to 100"),
        ("sk-entry weight=inf", "from 0.01 to 100"),
        ("sk-entry weight=1e-320", "from 0.01 to 100"),
        ("sk-entry rpm=many", "invalid literal"),
        ("sk-entry burst=3", "not one of"),
        ("sk-entry rpm=1 rpm=2", "once each"),
        ("sk-entry name=a/b", "letters, digits"),
    ],
)
def test_a_bad_entry_says_where_and_what(entry, words):
    with pytest.raises(ConfigError, match=words) as raised:
        parse_entry(entry, "keys.txt, entry 3")
    assert "keys.txt, entry 3" in str(raised.value)


def _rewrite(path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a new stamp even within the file system's clock tick


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "RECHECK_S", 0.0)
    monkeypatch.delenv(keys.ENV_VAR, raising=False)
    return tmp_path / "keys.txt"


def test_the_file_is_reread_when_it_changes_and_a_bad_change_keeps_the_old(key_file):
    key_file.write_text("# ours\nsk-alpha-1 name=a rpm=5\n")
    book = load_key_book(str(key_file))
    assert book is not None and book.match(b"sk-alpha-1").rpm == 5
    assert book.match(b"sk-bravo-1") is None
    _rewrite(key_file, "sk-alpha-1 name=a rpm=7\nsk-bravo-1 name=b\n", 1)
    assert book.match(b"sk-alpha-1").rpm == 7 and book.match(b"sk-bravo-1").tenant == "b"
    _rewrite(key_file, "sk-alpha-1 rpm=oops\nsk-bravo-1 name=b\n", 2)  # refused: all stay
    assert book.match(b"sk-alpha-1").rpm == 7 and book.match(b"sk-bravo-1") is not None
    _rewrite(key_file, "# nothing\n", 3)  # no key at all: a mistake, not a revocation
    assert book.match(b"sk-bravo-1") is not None
    _rewrite(key_file, "sk-alpha-1 name=a rpm=1\nsk-bravo-1 name=b\nsk-charlie name=a rpm=2\n", 4)
    assert book.match(b"sk-alpha-1").rpm == 7 and book.match(b"sk-charlie") is None


def test_a_key_revoked_in_a_file_that_no_longer_parses_stops_working(key_file, caplog):
    """The attack: the operator deletes a leaked key's line while another line has a typo. The
    file is refused as a whole, yet the leaked key must not keep working."""
    key_file.write_text("sk-leaked-1 name=a\nsk-kept-01 name=b rpm=5\n# sk-commented\n")
    book = load_key_book(str(key_file))
    assert book is not None and book.match(b"sk-leaked-1") is not None
    with caplog.at_level(logging.INFO, "kvpilot.keys"):
        _rewrite(key_file, "sk-kept-01 name=b rpm=oops\nsk-added-01 name=c\n", 1)
        assert book.match(b"sk-leaked-1") is None  # revoked at once
    assert book.match(b"sk-kept-01").rpm == 5  # kept as it was: its change waits
    assert book.match(b"sk-added-01") is None  # an addition waits for a file that parses
    assert "revoked 1 API key" in caplog.text and "sk-leaked" not in caplog.text
    _rewrite(key_file, "# sk-kept-01 name=b\nsk-added-01 name=c rpm=x\n", 2)  # commented out
    assert book.match(b"sk-kept-01") is None
    _rewrite(key_file, "sk-added-01 name=c\n", 3)  # and once the file parses, it is the book
    assert book.match(b"sk-added-01").tenant == "c" and book.match(b"sk-kept-01") is None


@pytest.mark.parametrize(
    "entry", ["name=ops rpm=100", "rpm=5", "tpm=9", "weight=2", "adapters=own name=ops"]
)
def test_an_entry_without_its_secret_is_refused(entry, key_file):
    with pytest.raises(ConfigError, match="the secret is missing"):
        parse_entry(entry, "keys.txt, entry 1")
    key_file.write_text(f"{entry}\n")
    with pytest.raises(ConfigError, match=r"keys\.txt, entry 1: .*the secret is missing"):
        load_key_book(str(key_file))


def test_a_key_shorter_than_the_minimum_is_refused():
    short = "k" * (keys.MIN_KEY_CHARS - 1)
    with pytest.raises(ConfigError, match=f"at least {keys.MIN_KEY_CHARS} characters") as raised:
        parse_entry(f"{short} name=t", "keys.txt, entry 2")
    assert "keys.txt, entry 2" in str(raised.value) and short not in str(raised.value)
    with pytest.raises(ConfigError, match="at least"):
        KeyBook.of(["x"])
    assert parse_entry("k" * keys.MIN_KEY_CHARS, "f").tenant.startswith("key-")


def _seconds_per_wrong_match(book: KeyBook) -> float:
    """The fastest of a few batches: what the lookup costs, not what the neighbours cost."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(100):
            assert book.match(b"sk-tenant-00000000-wrong") is None
        batches.append((time.perf_counter() - start) / 100)
    return min(batches)


def test_a_wrong_key_costs_the_same_with_one_key_or_twenty_thousand():
    """Each request used to compare its token with every key: 20,001 keys made a wrong key
    cost over half a millisecond of the event loop, a lever for anyone without a key."""
    one = KeyBook.of(["sk-tenant-00000000"])
    many = KeyBook.of([f"sk-tenant-{i:08d}" for i in range(20_001)])
    assert many.match(b"sk-tenant-00020000").tenant.startswith("key-")
    assert _seconds_per_wrong_match(many) < 20 * _seconds_per_wrong_match(one) + 20e-6


def test_no_source_means_no_authentication_and_an_empty_one_stops_the_start(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.ENV_VAR, raising=False)
    assert load_key_book(None) is None
    empty = tmp_path / "empty.txt"
    empty.write_text("# none\n")
    with pytest.raises(ConfigError, match="holds no API key"):
        load_key_book(str(empty))
    monkeypatch.setenv(keys.ENV_VAR, "sk-env-x rpm=2, sk-env-y")
    book = load_key_book(None)
    assert book is not None and book.match(b"sk-env-x").rpm == 2 and book.match(b"sk-env-y")
    assert KeyBook.of(["sk-code-1"]).match(b"sk-code-1").rpm is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refuse_with_the_wait_until_one_is_back():
    clock, key = Clock(), parse_entry("sk-limit name=t rpm=60", "f")
    limits = RateLimits(clock)
    verdicts = [limits.admit(key) for _ in range(61)]
    assert all(v.retry_after is None for v in verdicts[:60])
    refused = verdicts[60]
    assert refused.limit == "requests" and refused.retry_after == pytest.approx(1.0)
    headers = refusal_headers(refused)
    assert headers["Retry-After"] == "1" and headers["retry-after-ms"] == "1000"
    assert headers["x-ratelimit-limit-requests"] == "60"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    clock.now += 1.0  # exactly the wait: admitted
    assert limits.admit(key).retry_after is None
    assert limits.admit(key).retry_after == pytest.approx(1.0)


def test_tokens_per_minute_are_charged_after_and_a_debt_is_waited_out():
    clock, key = Clock(), parse_entry("sk-limit name=t tpm=600", "f")
    limits = RateLimits(clock)
    assert limits.admit(key).retry_after is None
    limits.charge(key, 500)
    assert limits.admit(key).headers["x-ratelimit-remaining-tokens"] == "100"
    limits.charge(key, 400)  # 300 in debt: 30 s at 10 tokens a second
    refused = limits.admit(key)
    assert refused.limit == "tokens" and refused.retry_after == pytest.approx(30.0)
    clock.now += 29.9
    assert limits.admit(key).retry_after == pytest.approx(0.1)
    clock.now += 0.1
    assert limits.admit(key).retry_after is None


def test_reservations_are_taken_from_a_bucket_out_of_debt_and_settled_to_what_was_used():
    """Concurrent requests each admitted before any was charged would overdraw the bucket by
    all their answers (four overdrew 300 tokens to 808): each reserves its estimate, and the
    one that finds the bucket in debt is refused, so the overdraw is one reservation at most."""
    clock, key = Clock(), parse_entry("sk-limit name=t tpm=600", "f")
    limits = RateLimits(clock)
    assert limits.reserve("t", 250) is None  # no tokens limit seen yet: nothing to take
    assert all(limits.admit(key).retry_after is None for _ in range(4))  # all at once
    assert [limits.reserve("t", 250) for _ in range(3)] == [None, None, None]  # 600 to -150
    assert limits.reserve("t", 250) == pytest.approx(15.0)  # 150 at 10 a second; not taken
    for _ in range(3):
        limits.charge(key, 200 - 250)  # each used 200: the surplus back, the debt repaid
    assert limits.admit(key).headers["x-ratelimit-remaining-tokens"] == "0"
    assert limits.reserve("t", 250) is None


def test_a_lowered_limit_cuts_the_bucket_and_tenants_are_apart():
    clock = Clock()
    limits = RateLimits(clock)
    wide, narrow = (
        parse_entry("sk-limit name=t rpm=100", "f"),
        parse_entry("sk-limit name=t rpm=2", "f"),
    )
    assert limits.admit(wide).headers["x-ratelimit-remaining-requests"] == "99"
    assert limits.admit(narrow).headers["x-ratelimit-remaining-requests"] == "1"
    assert limits.admit(parse_entry("sk-limit-2 name=u rpm=2", "f")).retry_after is None


@pytest.mark.parametrize(
    "seconds, text", [(0.0004, "1ms"), (0.12, "120ms"), (1.5, "1.5s"), (360, "6m0s")]
)
def test_resets_are_written_as_openai_writes_them(seconds, text):
    assert duration(seconds) == text


def test_the_gateway_reads_a_token_report_split_across_reads_and_counts_events_without_one():
    from kvpilot_common import trust
    from kvpilot_gateway.usage import UsageTap

    tap = UsageTap()
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n: ' + trust.USAGE_COMMENT.encode()
    stream += b" 1234\n\ndata: [DONE]\n\n"
    for i in range(0, len(stream), 7):  # in pieces that cut the report
        tap.feed(stream[i : i + 7])
    assert tap.tokens == 1234 and tap.events == 2
    headers = tap.headers([(b"content-type", b"x"), (trust.USAGE_HEADER.encode(), b"99")])
    assert headers == [(b"content-type", b"x")] and tap.tokens == 99
    left = UsageTap()
    left.feed(b'data: {"a": 1}\n\ndata: {"b"')  # the client left before any report
    assert left.tokens is None and left.events == 2


def test_one_key_given_twice_unlike_is_refused():
    with pytest.raises(ConfigError, match="one key is given twice, for tenants team-a and team-b"):
        KeyBook(env_value="sk-shared-key-1 name=team-a, sk-shared-key-1 name=team-b")
    with pytest.raises(ConfigError, match="given twice, for tenants team-a and team-a, not alike"):
        KeyBook(env_value="sk-shared-key-1 name=team-a, sk-shared-key-1 name=team-a adapters=all")
    book = KeyBook(env_value="sk-shared-key-1 name=team-a, sk-shared-key-1 name=team-a")
    assert book.match(b"sk-shared-key-1").tenant == "team-a"  # the same key twice, one tenant
