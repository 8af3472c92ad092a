"""The API keys a listener accepts, whose each one is, and its limits: the key book.

A source is --api-key-file (a line per key, `#` comments) or KVPILOT_API_KEYS (comma-separated
entries). An entry is the key, then optional settings, separated by spaces:

    sk-team-a-1  name=team-a  rpm=600  tpm=200000  weight=2

- `name`: the tenant the key belongs to (several keys may share one); the default is
  `key-` and the first hex digits of the key's SHA-256, so logs and metrics never show a key.
- `rpm`, `tpm`: requests and tokens per minute (http/rate_limit.py); absent: unlimited.
- `weight`: the tenant's share of the engine when tenants wait (the engine's fairness), from
  MIN_WEIGHT to MAX_WEIGHT.

Limits and weight are the tenant's, whatever key it uses: a setting on one of its keys holds
for all of them, and two keys of one tenant that disagree are refused.

The file is read again when it changes (a Kubernetes Secret's files are replaced in place), at
most once a second: keys and limits change without a restart. A file that no longer parses, or
that names no key, is refused and the book it had stays in force: failing open (no keys) or
closed (no one) on a typo would take the whole service down or open it.
"""

import hashlib
import hmac
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvpilot_common.errors import ConfigError

ENV_VAR = "KVPILOT_API_KEYS"
RECHECK_S = 1.0
# A tenant's share is a ratio to others': bounded, so that no counter stands still (an infinite
# weight) or overflows (a vanishing one) and fairness stays arithmetic.
MIN_WEIGHT, MAX_WEIGHT = 0.01, 100.0
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

log = logging.getLogger("kvpilot.keys")


@dataclass(frozen=True)
class Key:
    secret: bytes
    tenant: str
    weight: float | None = 1.0  # None: as parsed, not set (settle() gives it the tenant's)
    rpm: int | None = None
    tpm: int | None = None


def parse_entry(entry: str, where: str) -> Key:
    secret, *settings = entry.split()
    fields: dict[str, str] = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or name not in ("name", "rpm", "tpm", "weight") or name in fields:
            raise ConfigError(
                f"{where}: {setting!r} is not one of name=, rpm=, tpm=, weight= (once each)"
            )
        fields[name] = value
    tenant = fields.get("name") or "key-" + hashlib.sha256(secret.encode()).hexdigest()[:12]
    if not TENANT_NAME.match(tenant):
        raise ConfigError(f"{where}: name={tenant!r}: letters, digits, '.', '_', '-' (63 at most)")
    try:
        weight = float(fields.get("weight", "1"))
        rpm, tpm = (int(fields[k]) if k in fields else None for k in ("rpm", "tpm"))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ConfigError(f"{where}: weight is from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    if any(v is not None and v <= 0 for v in (rpm, tpm)):
        raise ConfigError(f"{where}: rpm and tpm are positive")
    return Key(secret.encode(), tenant, weight if "weight" in fields else None, rpm, tpm)


def clamp_weight(weight: float) -> float:
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight)) if math.isfinite(weight) else 1.0


def _entries(lines: list[str], source: str) -> list[Key]:
    return [
        parse_entry(line, f"{source}, entry {i}")
        for i, line in enumerate((raw.strip() for raw in lines), 1)
        if line and not line.startswith("#")
    ]


def settle(keys: list[Key]) -> list[Key]:
    """Each key with its tenant's settings: what any of the tenant's keys sets (weight 1 when
    none does). ConfigError when two keys of one tenant set one thing differently."""
    settings: dict[str, dict[str, float | int]] = {}
    for key in keys:
        known = settings.setdefault(key.tenant, {})
        for field in ("weight", "rpm", "tpm"):
            value = getattr(key, field)
            if value is None:
                continue
            if known.setdefault(field, value) != value:
                raise ConfigError(
                    f"tenant {key.tenant}: its keys set {field} to {known[field]:g} and "
                    f"{value:g}; set it once (it holds for all of them)"
                )
    return [
        Key(
            key.secret,
            key.tenant,
            float(settings[key.tenant].get("weight", 1.0)),
            settings[key.tenant].get("rpm"),  # type: ignore[arg-type]
            settings[key.tenant].get("tpm"),  # type: ignore[arg-type]
        )
        for key in keys
    ]


class KeyBook:
    """Every accepted key. `match` is what the listeners call; it notices a changed file."""

    def __init__(self, key_file: str | None = None, env_value: str | None = None) -> None:
        self.key_file = key_file
        self.check: Callable[[list[Key]], None] | None = None  # require()
        self.fixed: list[Key] = []
        if env_value is not None:
            self.fixed = _entries(env_value.split(","), ENV_VAR)
            if not self.fixed:
                raise ConfigError(f"{ENV_VAR} is set but holds no API key")
        self.from_file: list[Key] = []
        self._stamp: tuple | None = None
        self._checked = 0.0
        if key_file:
            self.from_file = self._read()
        self.settled = settle(self.fixed + self.from_file)

    @classmethod
    def of(cls, keys: list[str]) -> "KeyBook":
        """Keys given in code (tests, embedders): each its own tenant, no limits."""
        book = cls()
        book.fixed = [parse_entry(k, "key") for k in keys]
        book.settled = settle(book.fixed)
        return book

    def require(self, check: Callable[[list[Key]], None]) -> None:
        """A rule every version of the book must pass (ConfigError if not): now, and on each
        reload, which is refused like any other bad change."""
        check(self.settled)
        self.check = check

    @property
    def keys(self) -> list[Key]:
        self._maybe_reload()
        return self.settled

    def __bool__(self) -> bool:
        return bool(self.fixed or self.key_file)

    def match(self, token: bytes) -> Key | None:
        """The key `token` is, compared against every key in constant time, so the time taken
        says nothing about which one is close."""
        found = None
        for key in self.keys:
            if hmac.compare_digest(token, key.secret):
                found = key
        return found

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if not self.key_file or now - self._checked < RECHECK_S:
            return
        self._checked = now
        if self._file_stamp() == self._stamp:
            return
        try:
            read = self._read()
            settled = settle(self.fixed + read)
            if self.check is not None:
                self.check(settled)
            self.settled, self.from_file = settled, read
        except ConfigError as exc:
            self._stamp = self._file_stamp()  # said once per change, not every second
            log.error("keeping the API keys in force: %s", exc)
        else:
            log.info("API keys reloaded from %s: %d keys", self.key_file, len(self.from_file))

    def _file_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.key_file)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> list[Key]:
        assert self.key_file
        stamp = self._file_stamp()
        try:
            text = Path(self.key_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Cannot read the API key file {self.key_file}: {exc}") from exc
        found = _entries(text.splitlines(), self.key_file)
        if not found:
            raise ConfigError(
                f"The API key file {self.key_file} holds no API key (empty or only comments)"
            )
        self._stamp = stamp
        return found


def load_key_book(key_file: str | None) -> KeyBook | None:
    """The configured keys; None when no source is configured (no authentication). A source
    that is configured but yields no key stops the listener at start: serving without
    authentication because a Secret was empty would fail open."""
    env_value = os.environ.get(ENV_VAR)
    if env_value is None and not key_file:
        return None
    return KeyBook(key_file, env_value)
