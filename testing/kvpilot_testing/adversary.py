"""Measuring a live `kvpilot serve` while it is attacked: a /health poller, the queue and KV
gauges read from /metrics, the server's resident memory, a normal chat's latency; starting
servers (Fleet) and watching one that must refuse to start (fail_closed).

Used by tests/server/api/test_adversarial.py (which asserts) and benchmarks/adversarial.py
(which reports the same figures as JSON). Every loop is bounded in count and in time.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names
from kvpilot_testing.live_server import free_port, start_tiny_server, stop_server, terminate

HEALTH_BUDGET_S = 1.0  # /health must answer within this, during any attack
CHAT_FACTOR, CHAT_SLACK_S = 5.0, 0.5  # a normal chat afterwards: within 5x baseline + 0.5 s
AFTER_CHATS = 3  # normal chats after an attack; the fastest is held to the bar above
RSS_BUDGET_MIB = 200.0  # resident memory growth allowed per attack
IDLE_WAIT_S = 5.0  # an abort lands at the next engine step: poll the gauges this long
NORMAL_CHAT = {
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 8,
    "temperature": 0,
}


class HealthPoller:
    """GET /health every 100 ms on a background thread; keeps the worst latency and failures.
    A context manager: the attack runs inside the `with` block."""

    def __init__(self, base: str, interval: float = 0.1, max_s: float = 300.0) -> None:
        self.base, self.interval, self.max_s = base, interval, max_s
        self.worst_s, self.samples, self.failures = 0.0, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthPoller":
        self._thread.start()
        self._await_samples(1)  # the first answer: the poller is up before the attack starts
        return self

    def __exit__(self, *_) -> None:
        self._await_samples(self.samples + 2)  # and it saw the server after the attack too
        self._stop.set()
        self._thread.join(timeout=10)

    def _await_samples(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.samples < count and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)

    def _run(self) -> None:
        end = time.monotonic() + self.max_s
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.is_set() and time.monotonic() < end:
                start = time.monotonic()
                try:
                    status = client.get(f"{self.base}/health").status_code
                    if status != 200:
                        self.failures.append(f"status {status}")
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                self.worst_s = max(self.worst_s, time.monotonic() - start)
                self.samples += 1
                self._stop.wait(self.interval)


def read_gauges(base: str) -> dict[str, float | None]:
    """Sums over labels of the queue, running, KV-usage and admitted (in-flight) gauges;
    None for a gauge the server does not export."""
    wanted = {
        names.REQUESTS_WAITING: "waiting",
        names.REQUESTS_RUNNING: "running",
        names.KV_CACHE_USAGE: "kv_usage",
        names.REQUESTS_IN_FLIGHT: "in_flight",
    }
    out: dict[str, float | None] = dict.fromkeys(wanted.values())
    text = httpx.get(f"{base}/metrics", timeout=5.0).text
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            out[wanted[family.name]] = sum(s.value for s in family.samples)
    return out


def is_idle(gauges: dict[str, float | None], missing_ok: bool = False) -> bool:
    """All gauges zero (a missing gauge counts as not idle unless `missing_ok`)."""
    return all(v == 0 or (v is None and missing_ok) for v in gauges.values())


def wait_idle(base: str, timeout: float = IDLE_WAIT_S) -> dict[str, float | None]:
    """The gauges once all exported ones are zero, or the last reading after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = read_gauges(base)
        if is_idle(gauges, missing_ok=True) or time.monotonic() >= deadline:
            return gauges
        time.sleep(0.1)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def normal_chat(base: str, timeout: float = 30.0, headers: dict | None = None) -> tuple[int, float]:
    """(status, seconds) of one ordinary chat request on a fresh connection."""
    start = time.monotonic()
    try:
        status = httpx.post(
            f"{base}/v1/chat/completions", json=NORMAL_CHAT, timeout=timeout, headers=headers
        ).status_code
    except httpx.HTTPError:
        status = 0
    return status, time.monotonic() - start


@dataclass
class Target:
    """A live server and its figures at rest."""

    base: str
    pid: int
    headers: dict = field(default_factory=dict)  # e.g. the API key
    chat_baseline_s: float = 0.0

    def chat(self) -> tuple[int, float]:
        return normal_chat(self.base, headers=self.headers)

    def calibrate(self, rounds: int = 3) -> "Target":
        self.chat()  # warm-up: the first request compiles and allocates
        self.chat_baseline_s = sorted(self.chat()[1] for _ in range(rounds))[rounds // 2]
        return self

    def clean(self) -> bool:
        """Serving normally with nothing left over (else a test gets a fresh server)."""
        return self.chat()[0] == 200 and is_idle(wait_idle(self.base, 2.0), missing_ok=True)


class Attack:
    """`with Attack(target) as a:` runs the body under the /health poller; `a.figures` holds
    what happened to everyone else, `a.problems()` the requirements that were broken."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.figures: dict = {}

    def __enter__(self) -> "Attack":
        self.rss_before = rss_mib(self.target.pid)
        self.poller = HealthPoller(self.target.base).__enter__()
        self.started = time.monotonic()
        return self

    def __exit__(self, *_) -> None:
        attack_s = time.monotonic() - self.started
        self.poller.__exit__()
        t = self.target
        gauges = wait_idle(t.base)
        # The fastest of three: work the attack left behind slows every one of them, while the
        # machine's own load (another test's process on a 2-core runner) seldom slows all three.
        chats = [t.chat() for _ in range(AFTER_CHATS)]
        status = next((s for s, _ in chats if s != 200), 200)
        latency = min(seconds for _, seconds in chats)
        self.figures = {
            "attack_s": round(attack_s, 3),
            "health_worst_s": round(self.poller.worst_s, 3),
            "health_samples": self.poller.samples,
            "health_failures": self.poller.failures[:5],
            "chat_status": status,
            "chat_s": round(latency, 3),
            "chat_baseline_s": round(t.chat_baseline_s, 3),
            "rss_growth_mib": round(rss_mib(t.pid) - self.rss_before, 1),
            **gauges,
        }

    def problems(self) -> list[str]:
        f, found = self.figures, []
        if f["health_worst_s"] > HEALTH_BUDGET_S or f["health_failures"]:
            found.append(f"/health: worst {f['health_worst_s']} s, {f['health_failures']}")
        limit = CHAT_FACTOR * f["chat_baseline_s"] + CHAT_SLACK_S
        if f["chat_status"] != 200 or f["chat_s"] > limit:
            found.append(f"normal chat: {f['chat_status']} in {f['chat_s']} s (limit {limit:.2f})")
        gauges = {k: f[k] for k in ("waiting", "running", "kv_usage", "in_flight")}
        missing = [k for k, v in gauges.items() if v is None]
        if missing:
            found.append(f"gauges not exported: {missing}")
        if not is_idle(gauges, missing_ok=True):
            found.append(f"not idle afterwards: {gauges}")
        if f["rss_growth_mib"] > RSS_BUDGET_MIB:
            found.append(f"RSS grew {f['rss_growth_mib']} MiB")
        return found


class Fleet:
    """Live tiny-model servers by name. A server that an attack left unclean (refusing normal
    requests, or with requests left over) is replaced before the next one gets it."""

    def __init__(self, model_dir) -> None:
        self.model_dir, self.live, self.restarts = model_dir, {}, 0

    def get(self, name: str, *flags: str, headers: dict | None = None) -> Target:
        if name in self.live and self.live[name][1].clean():
            return self.live[name][1]
        if name in self.live:
            proc = self.live.pop(name)[0]
            # It may never drain (requests it thinks are in flight): SIGTERM, and after 2 s
            # stop_server's second SIGTERM, which exits at once.
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            stop_server(proc)
            self.restarts += 1
        proc, base = start_tiny_server(self.model_dir, *flags)
        self.live[name] = (proc, Target(base, proc.pid, headers or {}).calibrate())
        return self.live[name][1]

    def close(self) -> None:
        while self.live:
            stop_server(self.live.popitem()[1][0])


def error_shape(response: httpx.Response) -> dict:
    """The `error` object if the body has OpenAI's error shape, else {}."""
    try:
        error = response.json()["error"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return {}
    return error if {"message", "type", "param", "code"} <= set(error) else {}


def fail_closed(model_dir, key_file: str, env_keys: str | None, limit_s: float = 60.0) -> dict:
    """Start `kvpilot serve --api-key-file key_file` (KVPILOT_API_KEYS=env_keys, unset if None)
    and watch it: does it exit, how fast, saying what; or does it serve with no key at all?"""
    env = {k: v for k, v in os.environ.items() if k != "KVPILOT_API_KEYS"}
    # No kernel build: a process stopped mid-build would leave torch's build lock behind.
    env["KVPILOT_CPU_KERNELS"] = "0"
    if env_keys is not None:
        env["KVPILOT_API_KEYS"] = env_keys
    port = free_port()
    cmd = [sys.executable, "-m", "kvpilot_common.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--model", str(model_dir), "--kv-cache-bytes", "16MiB"]
    cmd += ["--max-model-len", "256", "--api-key-file", key_file]
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
        start, served, exit_code = time.monotonic(), False, None
        try:
            while time.monotonic() - start < limit_s and not served:
                time.sleep(0.2)
                if (exit_code := proc.poll()) is not None:
                    break
                with contextlib.suppress(httpx.HTTPError):
                    served = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success
        finally:
            if proc.poll() is None:
                terminate(proc, grace=10)
        seconds = time.monotonic() - start
        log.seek(0)
        tail = log.read()[-300:]
    return {"exit_code": exit_code, "served": served, "seconds": round(seconds, 2), "log": tail}


def fail_closed_all(model_dir, key_dir, cases: dict[str, tuple[str, str | None]]) -> dict:
    """fail_closed for each case (key file name under key_dir, KVPILOT_API_KEYS), at once."""
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {
            name: pool.submit(fail_closed, model_dir, str(key_dir / file), env)
            for name, (file, env) in cases.items()
        }
        return {name: f.result() for name, f in futures.items()}
