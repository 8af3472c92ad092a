"""Running Python with some installed modules made unimportable, as if they were not installed:
how tests/test_packaging.py holds each side to its extra, and how other tests check that a
module loads without torch. A sitecustomize first on PYTHONPATH puts a finder at the head of
sys.meta_path that answers None for the hidden modules."""

import os
import subprocess
import sys
from collections.abc import Set
from pathlib import Path

# The sitecustomize. Hidden modules look absent, not broken: every finder on sys.meta_path is
# wrapped to answer None for them, so `import torch` raises the usual ModuleNotFoundError and
# importlib.util.find_spec("torch") is None (libraries probe optional modules that way; a finder
# that raised instead would break them where a real install without torch works).
HIDER = """
import os
import sys

_block = set(filter(None, os.environ.get("KVPILOT_TEST_HIDE", "").split(",")))
_allow = os.environ.get("KVPILOT_TEST_ALLOW_ONLY")
_allow = None if _allow is None else set(_allow.split(",")) | set(sys.stdlib_module_names)
# sysconfig's build-time data (read by zoneinfo, so by dateutil and matplotlib) is part of the
# standard library, though sys.stdlib_module_names does not list it.
_STDLIB_PREFIXES = ("_sysconfigdata_",)
_log = os.environ.get("KVPILOT_TEST_HIDDEN_LOG")


class _Hiding:
    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        allowed = top in _allow or top.startswith(_STDLIB_PREFIXES) if _allow is not None else True
        if top in _block or not allowed:
            if _log:
                with open(_log, "a") as f:
                    f.write(name + "\\n")
            return None
        find = getattr(self._finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attribute):  # invalidate_caches, find_distributions, ...
        return getattr(self._finder, attribute)


sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
"""


def hiding_env(
    tmp_path: Path, hide: Set[str] = frozenset(), allow_only: Set[str] | None = None
) -> dict[str, str]:
    """os.environ with the hider first on PYTHONPATH: `hide` made unimportable, or everything
    but `allow_only` (and the standard library). What was hidden is logged for
    hidden_imports()."""
    site = tmp_path / "hider"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDER)
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env["KVPILOT_TEST_HIDE"] = ",".join(sorted(hide))
    env["KVPILOT_TEST_HIDDEN_LOG"] = str(tmp_path / "hidden.log")
    if allow_only is not None:
        env["KVPILOT_TEST_ALLOW_ONLY"] = ",".join(sorted(allow_only))
    else:
        env.pop("KVPILOT_TEST_ALLOW_ONLY", None)
    return env


def run_python(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """This interpreter with `args`, in `env` (from hiding_env()), its output captured."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def hidden_imports(tmp_path: Path) -> list[str]:
    """The modules a process in hiding_env(tmp_path) tried to import and was refused."""
    log = tmp_path / "hidden.log"
    return log.read_text().split() if log.exists() else []
