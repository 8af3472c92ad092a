"""The API keys a listener accepts, whose each one is, and its limits: the key book.

A source is --api-key-file (a line per key, `#` comments) or KVPILOT_API_KEYS (comma-separated
entries). An entry is the key, then optional settings, separated by spaces:

    sk-team-a-1  name=team-a  rpm=600  tpm=200000  weight=2  adapters=own

- the key itself: MIN_KEY_CHARS characters at least, and never shaped like a setting (`rpm=5`
  first is a line whose key was forgotten, refused rather than taken as the key `rpm=5`).
- `name`: the tenant the key belongs to (several keys may share one); the default is
  `key-` and the first hex digits of the key's SHA-256, so logs and metrics never show a key.
- `rpm`, `tpm`: requests and tokens per minute (http/rate_limit.py); absent: unlimited.
- `weight`: the tenant's share of the engine when tenants wait (the engine's fairness), from
  MIN_WEIGHT to MAX_WEIGHT.
- `adapters`: what the key may do with LoRA adapters at run time (the server's
  /v1/load_lora_adapter and /v1/unload_lora_adapter, docs/lora.md); absent: nothing.
  `own`: load adapters, which its tenant then owns, and unload its tenant's. `all`: also
  unload anyone's, another tenant's and the operator's (--lora-modules, the adapter list).

Limits and weight are the tenant's, whatever key it uses: a setting on one of its keys holds
for all of them, and two keys of one tenant that disagree are refused. `adapters` is the key's
own: a tenant may keep one key that manages its adapters and others that only use them.

A key is found by its SHA-256 in a dict: one lookup whatever the number of keys, and no timing
that depends on how much of a guess is right (the dict compares digests, which a guess cannot
steer).

The file is read again when it changes (a Kubernetes Secret's files are replaced in place), at
most once a second: keys and limits change without a restart. A file that no longer parses is
refused and the book it had stays in force (failing open or closed on a typo would take the
whole service down or open it), less every key whose secret no longer starts one of the file's
entries: a revocation takes effect even while another line has a typo; additions and changes
wait for a file that parses. A file that cannot be read or holds no entry at all changes
nothing (an emptied Secret or a half-written file is a mistake, not a revocation of all keys).
"""

import hashlib
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
# Not a strength requirement (a real key is random and far longer): the shortest that is not
# plainly a mistake, a placeholder, an initial or a truncated paste that anyone could guess.
MIN_KEY_CHARS = 8
# What `adapters=` may say: `own` manages its tenant's adapters, `all` anyone's.
ADAPTERS_OWN, ADAPTERS_ALL = "own", "all"
SETTINGS = ("name", "rpm", "tpm", "weight", "adapters")

log = logging.getLogger("kvpilot.keys")


@dataclass(frozen=True)
class Key:
    secret: bytes
    tenant: str
    weight: float | None = 1.0  # None: as parsed, not set (settle() gives it the tenant's)
    rpm: int | None = None
    tpm: int | None = None
    adapters: str | None = None  # ADAPTERS_OWN, ADAPTERS_ALL; None: no run-time adapters


def digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def parse_entry(entry: str, where: str) -> Key:
    secret, *settings = entry.split()
    if secret.partition("=")[0] in SETTINGS and "=" in secret:
        raise ConfigError(f"{where}: the secret is missing: an entry starts with the key")
    if len(secret) < MIN_KEY_CHARS:
        raise ConfigError(f"{where}: a key has at least {MIN_KEY_CHARS} characters")
    fields: dict[str, str] = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or name not in SETTINGS or name in fields:
            listed = ", ".join(f"{s}=" for s in SETTINGS)
            raise ConfigError(f"{where}: {setting!r} is not one of {listed} (once each)")
        fields[name] = value
    adapters = fields.get("adapters")
    if adapters not in (None, ADAPTERS_OWN, ADAPTERS_ALL):
        raise ConfigError(f"{where}: adapters is {ADAPTERS_OWN} or {ADAPTERS_ALL}")
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
    weight_set = weight if "weight" in fields else None
    return Key(secret.encode(), tenant, weight_set, rpm, tpm, adapters)


def clamp_weight(weight: float) -> float:
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight)) if math.isfinite(weight) else 1.0


def _numbered(lines: list[str]) -> list[tuple[int, str]]:
    """The entries with their line numbers: blank lines and comments are none."""
    stripped = enumerate((raw.strip() for raw in lines), 1)
    return [(i, line) for i, line in stripped if line and not line.startswith("#")]


def _entries(lines: list[str], source: str) -> list[Key]:
    return [parse_entry(line, f"{source}, entry {i}") for i, line in _numbered(lines)]


def settle(keys: list[Key]) -> list[Key]:
    """Each key with its tenant's settings: what any of the tenant's keys sets (weight 1 when
    none does). ConfigError when two keys of one tenant set one thing differently, or one key
    is given twice unlike (for two tenants, or with other settings: the last line's would win,
    silently)."""
    settings: dict[str, dict[str, float | int]] = {}
    seen: dict[bytes, Key] = {}
    for key in keys:
        first = seen.setdefault(digest(key.secret), key)
        if first != key:
            raise ConfigError(
                f"one key is given twice, for tenants {first.tenant} and {key.tenant}, not "
                "alike: give each key once"
            )
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
            key.adapters,
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
            self._stamp = self._file_stamp()
            self.from_file = self._parse(self._text())
        self._install(settle(self.fixed + self.from_file))

    @classmethod
    def of(cls, keys: list[str]) -> "KeyBook":
        """Keys given in code (tests, embedders): each its own tenant, no limits."""
        book = cls()
        book.fixed = [parse_entry(k, "key") for k in keys]
        book._install(settle(book.fixed))
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
        """The key `token` is: one lookup of its digest, however many keys there are."""
        self._maybe_reload()
        return self._by_digest.get(digest(token))

    def _install(self, settled: list[Key]) -> None:
        self.settled = settled
        self._by_digest = {digest(key.secret): key for key in settled}

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if not self.key_file or now - self._checked < RECHECK_S:
            return
        self._checked = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp  # taken before the read: a change during it is read next time
        try:
            text = self._text()
        except ConfigError as exc:  # said once per change, not every second
            log.error("keeping the API keys in force: %s", exc)
            return
        try:
            read = self._parse(text)
            settled = settle(self.fixed + read)
            if self.check is not None:
                self.check(settled)
        except ConfigError as exc:
            log.error("keeping the API keys in force: %s", exc)
            self._revoke(text)
            return
        self.from_file = read
        self._install(settled)
        log.info("API keys reloaded from %s: %d keys", self.key_file, len(read))

    def _revoke(self, text: str) -> None:
        """Drop the file's keys whose secret starts none of the refused file's entries."""
        kept = {line.split()[0].encode() for _, line in _numbered(text.splitlines())}
        if not kept:  # no entry at all: a mistake, not a revocation of every key
            return
        kept |= {key.secret for key in self.fixed}
        gone = [key for key in self.from_file if key.secret not in kept]
        if not gone:
            return
        self.from_file = [key for key in self.from_file if key.secret in kept]
        self._install([key for key in self.settled if key.secret in kept])
        tenants = ", ".join(sorted({k.tenant for k in gone}))
        log.warning(
            "revoked %d API key(s) gone from %s (tenants %s), though the file is refused",
            len(gone),
            self.key_file,
            tenants,
        )

    def _file_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.key_file)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _text(self) -> str:
        assert self.key_file
        try:
            return Path(self.key_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Cannot read the API key file {self.key_file}: {exc}") from exc

    def _parse(self, text: str) -> list[Key]:
        found = _entries(text.splitlines(), str(self.key_file))
        if not found:
            raise ConfigError(
                f"The API key file {self.key_file} holds no API key (empty or only comments)"
            )
        return found


def load_key_book(key_file: str | None) -> KeyBook | None:
    """The configured keys; None when no source is configured (no authentication). A source
    that is configured but yields no key stops the listener at start: serving without
    authentication because a Secret was empty would fail open."""
    env_value = os.environ.get(ENV_VAR)
    if env_value is None and not key_file:
        return None
    return KeyBook(key_file, env_value)
