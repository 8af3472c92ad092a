"""One pytest session's live `kvpilot serve` processes, shared by what they were started with (a
pytest plugin: tests/conftest.py loads it; the `server_pool` fixture hands it out).

A server's start is seconds of imports and model loading, and many test modules ask for the very
same server; the pool starts each (flags, environment) once and hands the same process to every
asker. Sharing is only sound for a server nobody changes, so:

- a test that changes its server for good (stops it, drains it, loads adapters, exhausts a
  limit whose window persists, rewrites a file it reads) takes a `private` one, or `retire`s
  the shared one so the next asker gets a fresh process;
- a test that reads a counter reads its change across the test, never its absolute value;
- a test that fails while it holds a server retires it (its state is then unknown), so a
  failure stays one failure instead of spreading into the next modules;
- a server handed out again is idle first (nothing waiting, running or in flight, the KV cache
  empty); one that does not settle is replaced;
- a server that died under the pool is never handed out again, and its asker is told why.

At most `size` servers no test holds stay alive (the least recently used is stopped first);
held ones are never stopped under a test. All are stopped by PID at the end of the session.
"""

import os
import subprocess
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpilot_testing.adversary import is_idle, wait_idle
from kvpilot_testing.live_server import reap, start_server, tiny_flags

SIZE_ENV = "KVPILOT_SERVER_POOL_SIZE"  # how many unheld servers may stay alive
# Each tiny server holds most of a GiB; four cover the keys the suite interleaves.
DEFAULT_SIZE = 4

# An abort lands at the server's next engine step; a stream a test dropped, within seconds.
SETTLE_S = 30.0

Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]


@dataclass(eq=False)
class LiveServer:
    proc: subprocess.Popen
    base: str
    key: Key | None  # None: a private server, never handed to anyone else
    holders: int = 0
    retired: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_size(self) -> int:
        """Bytes of log so far: a test that reads the log of a shared server reads from here."""
        return os.fstat(self.proc.log.fileno()).st_size

    def log_text(self, start: int = 0) -> str:
        """The server's output from byte `start` on. pread leaves the file's offset alone: the
        server writes at that same offset (one open file shared with the child)."""
        fd = self.proc.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size - start, start).decode(errors="replace")


class ServerPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.live: OrderedDict[Key, LiveServer] = OrderedDict()  # least recently used first
        self.held: list[LiveServer] = []  # every hold open now, shared and private
        # Sent SIGTERM, not yet waited for: they drain and exit while the tests go on.
        self.stopping: list[subprocess.Popen] = []
        self.starts = self.shared_starts = self.reuses = self.unsettled = 0

    @contextmanager
    def lease(self, *args: str, env: Mapping[str, str] | None = None) -> Iterator[LiveServer]:
        """The shared `kvpilot serve *args` (with `env` added to the environment), started if
        none is live; never stopped while held."""
        key: Key = (args, tuple(sorted((env or {}).items())))
        server = self.live.get(key)
        if server is not None and server.proc.poll() is not None:
            del self.live[key]  # never handed out again
            self._stop([server])
            raise RuntimeError(
                f"a pooled server ({server.base}) exited with {server.proc.returncode}: a test "
                f"stopped it without retiring it, or it crashed:\n{server.log_text()[-2000:]}"
            )
        if server is not None and not _settles(server.base):
            self.retire(server)  # requests a test left running: the next asker would see them
            self.unsettled += 1
            server = None
        if server is None:
            self._make_room(for_new=1)
            proc, base = start_server(*args, env=env)
            server = self.live[key] = LiveServer(proc, base, key)
            self.starts += 1
            self.shared_starts += 1
        else:
            self.reuses += 1
        self.live.move_to_end(key)
        with self._held(server):
            yield server

    def tiny(
        self,
        model_dir: str | Path,
        *extra: str,
        name: str = "tiny",
        env: Mapping[str, str] | None = None,
    ) -> AbstractContextManager[LiveServer]:
        """lease() of live_server.tiny_flags(model_dir, *extra, name=name)."""
        return self.lease(*tiny_flags(model_dir, *extra, name=name), env=env)

    @contextmanager
    def private(self, *args: str, env: Mapping[str, str] | None = None) -> Iterator[LiveServer]:
        """A server of its own, stopped when the hold ends: for a test that changes it for
        good and would rather not share it at all."""
        proc, base = start_server(*args, env=env)
        self.starts += 1
        server = LiveServer(proc, base, None, retired=True)
        with self._held(server):
            yield server

    def private_tiny(
        self,
        model_dir: str | Path,
        *extra: str,
        name: str = "tiny",
        env: Mapping[str, str] | None = None,
    ) -> AbstractContextManager[LiveServer]:
        """private() of live_server.tiny_flags(model_dir, *extra, name=name)."""
        return self.private(*tiny_flags(model_dir, *extra, name=name), env=env)

    def retire(self, server: LiveServer) -> None:
        """The next asker of this key gets a fresh process; this one stops once nobody holds
        it."""
        if server.key is not None and self.live.get(server.key) is server:
            del self.live[server.key]
        server.retired = True
        if server.holders == 0:
            self._stop([server])

    def retire_held(self) -> None:
        """Retire every server a test holds now (it failed: their state is unknown)."""
        for server in list(self.held):
            self.retire(server)

    def close(self) -> None:
        """Stop every server, all side by side, and wait for each by PID."""
        self._stop(list(self.live.values()))
        self.live.clear()
        reap(self.stopping)
        self.stopping.clear()

    @contextmanager
    def _held(self, server: LiveServer) -> Iterator[None]:
        server.holders += 1
        self.held.append(server)
        try:
            yield
        finally:
            server.holders -= 1
            self.held.remove(server)
            if server.retired and server.holders == 0:
                self._stop([server])
            self._make_room(for_new=0)

    def _make_room(self, for_new: int) -> None:
        """Stop the least recently used unheld servers beyond `size`, all at once."""
        excess = len(self.live) + for_new - self.size
        victims = [s for s in self.live.values() if s.holders == 0][: max(0, excess)]
        for server in victims:
            self.live.pop(server.key)  # type: ignore[arg-type]  # a shared one: it has a key
        self._stop(victims)

    def _stop(self, servers: list[LiveServer]) -> None:
        """SIGTERM now; the wait comes later (close, or the next stop finds them gone)."""
        for server in servers:
            if server.proc not in self.stopping:
                server.proc.terminate()
                self.stopping.append(server.proc)
        for proc in [p for p in self.stopping if p.poll() is not None]:
            self.stopping.remove(proc)
            proc.log.close()


def _settles(base: str) -> bool:
    return is_idle(wait_idle(base, SETTLE_S), missing_ok=True)


POOL = pytest.StashKey[ServerPool]()


@pytest.fixture(scope="session")
def server_pool(request: pytest.FixtureRequest) -> Iterator[ServerPool]:
    pool = ServerPool(int(os.environ.get(SIZE_ENV, DEFAULT_SIZE)))
    request.config.stash[POOL] = pool
    try:
        yield pool
    finally:
        pool.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    pool = item.config.stash.get(POOL, None)
    if pool is not None and outcome.get_result().failed:
        pool.retire_held()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    pool = config.stash.get(POOL, None)
    if pool is not None:
        terminalreporter.write_line(
            f"kvpilot serve: {pool.starts} started ({pool.shared_starts} shared, "
            f"{pool.starts - pool.shared_starts} private), {pool.reuses} asks served by a "
            f"live shared one, {pool.unsettled} replaced for not settling"
        )
