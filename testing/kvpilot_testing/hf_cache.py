"""Hugging Face reference outputs kept on disk between runs, outside the repository.

The oracle itself is unchanged: on a miss the same Hugging Face code runs and its answer is
stored; on a hit the stored answer is the one that code gave for exactly this input. An entry's
key names everything the answer depends on: the transformers and torch versions, the CPU
capability torch dispatches to (float32 reductions may round differently across AVX2, AVX-512
and AMX, and a greedy tie can turn on that), the bytes of every file in each model directory
(the tiny models are rebuilt from a seed on every run, so their files, not their names, are the
honest key), how the reference model is built from them, and the call's arguments.

Entries are written to a temporary file and renamed into place, so a reader sees a whole entry
or none; an entry that cannot be read, does not parse, or names another key is recomputed.
"""

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = 1  # bump when what an entry holds changes meaning


def cache_dir() -> Path:
    """$KVPILOT_CACHE/hf-reference (default ~/.cache/kvpilot/hf-reference)."""
    root = os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot"
    return Path(root) / "hf-reference"


def directory_digest(path: Path) -> str:
    """A hash of every file under a model directory, names and bytes. Memoised per path, but
    only while no file there changed size or modification time: a test that rewrites a
    checkpoint in place gets a new digest, not the old one's entries."""
    path = Path(path).resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    signature = tuple(
        (str(p.relative_to(path)), (s := p.stat()).st_size, s.st_mtime_ns) for p in files
    )
    return _digest(path, signature)


@functools.cache
def _digest(path: Path, signature: tuple[tuple[str, int, int], ...]) -> str:
    whole = hashlib.sha256()
    for name, _, _ in signature:
        with open(path / name, "rb") as f:
            part = hashlib.file_digest(f, "sha256").hexdigest()
        whole.update(f"{name}\0{part}\n".encode())
    return whole.hexdigest()


@functools.cache
def environment() -> dict[str, str]:
    """What, beside the inputs, decides a reference's float32 numbers on this machine."""
    import platform

    import torch
    import transformers

    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def cached(key: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """compute()'s JSON-able answer for `key`, from disk when a run before stored it."""
    full = {"format": FORMAT, "environment": environment(), **key}
    text = json.dumps(full, sort_keys=True)
    entry = cache_dir() / f"{hashlib.sha256(text.encode()).hexdigest()}.json"
    found = _read(entry, full)
    if found is not None:
        return found["value"]
    value = compute()
    _write(entry, {"key": full, "value": value})
    return value


def _read(entry: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    try:
        stored = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable, or not JSON: computed again
        return None
    # The file's name is a hash of the key; the key inside it is compared too, so an entry that
    # was damaged or belongs to something else is never taken for this one.
    if not isinstance(stored, dict) or stored.get("key") != key or "value" not in stored:
        return None
    return stored


def _write(entry: Path, stored: dict[str, Any]) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(stored, f)
        os.replace(temporary, entry)  # atomic: a reader sees the old entry, or this whole one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
