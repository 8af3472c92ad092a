"""Every generated file, and the one command that writes or checks them (scripts/generate.py).

One registry, so a new generated file is checked by the same test as the others the moment it
is added here (tests/test_generate.py runs `scripts/generate.py --check`).
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from . import benchmarks, chart, crd_reference, monitoring
from .paths import COMMAND, ROOT

GENERATORS: tuple[Callable[[], dict[Path, bytes]], ...] = (
    benchmarks.render,
    chart.render,
    crd_reference.render,
    monitoring.render,
)


def outputs() -> dict[Path, bytes]:
    """Path relative to the repository root -> the bytes it must hold."""
    files: dict[Path, bytes] = {}
    for render in GENERATORS:
        made = render()
        # Two generators writing one path would leave it to whichever ran last.
        if clash := files.keys() & made.keys():
            raise ValueError(f"generated twice: {sorted(map(str, clash))}")
        files.update(made)
    return files


def stale(root: Path = ROOT, files: dict[Path, bytes] | None = None) -> list[Path]:
    """Generated files under `root` that are missing or differ from `files` (by default what the
    generators make now); compared as bytes, so a changed line ending counts."""
    files = outputs() if files is None else files
    return [
        path
        for path, content in files.items()
        if not (root / path).is_file() or (root / path).read_bytes() != content
    ]


def write(root: Path = ROOT) -> list[Path]:
    """Write the files that are stale, and only those (an unchanged file keeps its mtime);
    returns what was written."""
    files = outputs()
    written = stale(root, files)
    for path in written:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(files[path])
    return written


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/generate.py", description="Write every generated file of the repository."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1, naming each one, if any generated file is stale",
    )
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale(root)
        for path in out_of_date:
            print(f"stale: {path} (run {COMMAND})", file=sys.stderr)
        return 1 if out_of_date else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0
