"""The node, played by the test, for the session's control plane on 127.0.0.1 (no scheduler,
no kubelet there): a Node object, and a loop that binds each new pod of one namespace to it (or
reports it unschedulable), reports it running and ready, and finishes deleting pods the way a
kubelet does once its containers stopped (the API server waits for that on bound pods).

With `serve`, every pod gets a real `kvpilot serve` on its own 127.0.0.x address and the pod
port, reported running and ready, with the address as its IP, once `ready` says it answers, as
a kubelet starts the container and probes it. `serve` is given the address and the pod, so the
server can follow the pod's container args (the served model name the gateway routes by); it
returns at once, so the loop goes on with other pods while a server loads, and stop() holds
every process started, loaded or not, and stops each by PID.

A real node exists (kube/realnode.py, tests/e2e/): what a kubelet, containerd and the scheduler
do is tested there, the operator and gateway run as pods from their image. What stays played
here, and why: model pods that serve, since the server-cpu image (torch, about 4 GB) is not yet
built for the real node, so the gateway, autoscaler and wake tests start `kvpilot serve` on
loopback in their place; and a node that turns full or free on demand (`schedulable`), which
a real scheduler only shows after pods fill it."""

import contextlib
import functools
import itertools
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from kvpilot_testing.kube.cluster import PODS, Cluster
from kvpilot_testing.live_server import stop_side_by_side

NODE = "kvpilot-test-node"
PORT = 8000  # the model server's port in the pod template (render.py)
# (address, pod) -> a handle for stop_server: starts the model server the pod's container runs.
Serve = Callable[[str, dict], Any]
# (handle, address) -> whether that server answers now; raises once it never will (it exited).
Ready = Callable[[Any, str], bool]
# The IP of a pod without a server: loopback, where nothing listens on the pod port, so a scrape
# of it is refused at once.
NO_SERVER = "127.0.0.254"
# One sequence for every Node of the process: two Nodes (two namespaces' tests, or one test's
# two) must never hand out one address, or a readiness check could be answered by a server of
# the other namespace. A stopped server's address is not reused within the process either. It
# starts where this process draws: test runs side by side on one machine that all counted from
# 20 chose the same addresses at once, before any server had bound one (the bind check below
# cannot see that), and a pod was served by another run's server.
_SPAN = 250 * 250  # 127.0.x.y
_ADDRESSES = itertools.count(random.randrange(_SPAN))
_ADDRESSES_LOCK = threading.Lock()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_node(http: httpx.Client) -> None:
    """The Node the pods are bound to (the pod garbage collector deletes pods whose node is
    missing). No node-lifecycle controller runs, so it is never tainted."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }
    response = http.post("/api/v1/nodes", json=node)
    if response.status_code not in (201, 409):
        response.raise_for_status()


def running(pod: dict, ip: str) -> dict:
    """The status a kubelet reports for a pod whose containers all run and pass readiness."""
    now = _now()
    containers = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in pod["spec"]["containers"]
    ]
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": containers,
    }


def unschedulable(message: str) -> dict:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": _now(),
    }
    return {"phase": "Pending", "conditions": [condition]}


class Node:
    """Call sync() for one pass, or start() for a pass every `interval` seconds until stop().
    Set `schedulable` False to report new pods unschedulable with `unschedulable_message`."""

    def __init__(
        self,
        cluster: Cluster,
        serve: Serve | None = None,
        stop_server: Callable[[Any], None] | None = None,
        ready: Ready | None = None,
    ) -> None:
        """Without `ready`, a pod is reported ready as soon as `serve` returns."""
        self.cluster, self.serve, self.stop_server = cluster, serve, stop_server
        self.ready = ready
        self.schedulable = True
        self.unschedulable_message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        self.servers: dict[str, tuple[Any, str]] = {}  # pod name -> (server, address)
        self._starting: dict[str, dict] = {}  # pod name -> pod, while its server does not answer
        # Held while a server starts and while stop() takes them all: stop() sees every server
        # started, and none starts after it, whatever the loop's thread is doing then.
        self._lock = threading.Lock()
        self._stopped = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        ensure_node(cluster.http)

    def sync(self) -> None:
        pods = {p["metadata"]["name"]: p for p in self.cluster.list(PODS)}
        for name in [n for n in self.servers if n not in pods]:
            self._kill(name)
        for name, pod in pods.items():
            if pod["metadata"].get("deletionTimestamp"):
                self._finish_deleting(name)
            elif not pod["spec"].get("nodeName"):
                self._place(pod)
        self._probe()

    def _place(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        if not self.schedulable:
            scheduled = [c for c in pod.get("status", {}).get("conditions", [])]
            if not any(c["type"] == "PodScheduled" for c in scheduled):
                self._report(name, unschedulable(self.unschedulable_message))
            return
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        self.cluster.http.post(f"{self.cluster.path(PODS, name)}/binding", json=binding)
        address = NO_SERVER
        if self.serve is not None:
            address = self._free_address()
            with self._lock:
                if self._stopped:
                    return
                self.servers[name] = (self.serve(address, pod), address)
            if self.ready is not None:
                self._starting[name] = pod  # running once it answers (_probe)
                return
        self._report(name, running(pod, address))

    def _probe(self) -> None:
        """The readiness probe of each server still starting: its pod is reported running and
        ready once it answers; one that exited is an error (shown if the test fails)."""
        for name, pod in list(self._starting.items()):
            started = self.servers.get(name)
            if started is None or self._stopped:  # its pod went meanwhile, or stop() took it
                del self._starting[name]
                continue
            try:
                answers = self.ready is not None and self.ready(*started)
            except RuntimeError as exc:
                del self._starting[name]
                self.errors.append(f"{name}: {exc}")
                continue
            if answers:
                del self._starting[name]
                self._report(name, running(pod, started[1]))

    def _free_address(self) -> str:
        """The next 127.0.x.y of this process whose pod port nobody listens on: another test run
        on this machine must not answer for this pod either."""
        for _ in range(_SPAN):
            with _ADDRESSES_LOCK:
                n = next(_ADDRESSES) % _SPAN
            address = f"127.0.{n // 250}.{n % 250}"
            if n % 250 < 20 or address == NO_SERVER:
                continue  # 127.0.0.1 and the low addresses belong to the tests' other servers
            with socket.socket() as probe:
                try:
                    probe.bind((address, PORT))
                except OSError:
                    continue
            return address
        raise RuntimeError("no free 127.0.x.y address left for a pod")

    def _report(self, name: str, status: dict) -> None:
        self.cluster.patch(PODS, name, {"status": status}, "status")

    def _finish_deleting(self, name: str) -> None:
        self._kill(name)
        self.cluster.http.request(
            "DELETE", self.cluster.path(PODS, name), json={"gracePeriodSeconds": 0}
        )

    def _kill(self, name: str) -> None:
        with self._lock:  # the loop and stop() may both stop one: only one gets it
            started = self.servers.pop(name, None)
        if started is not None and self.stop_server is not None:
            self.stop_server(started[0])

    def addresses(self) -> list[str]:
        return [address for _, address in list(self.servers.values())]

    # -- a background loop --------------------------------------------------------------------

    def start(self, interval: float = 0.2) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sync()
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))  # shown if a test fails; the loop goes on
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, daemon=True, name="test-node")
        self._thread.start()

    def stop(self) -> None:
        """Every server started is stopped by its process, loaded or still loading, whatever
        the loop is doing (a pass held up by a slow API server); after this none starts. Side
        by side: one after another, a teardown waited out each server's drain in turn."""
        self._stop.set()
        with self._lock:
            self._stopped = True
            names = list(self.servers)
        stop_side_by_side([functools.partial(self._kill, name) for name in names])
        if self._thread is not None:
            self._thread.join(30)  # a pass ends with its API call's timeout; it starts nothing


def container_flag(pod: dict, flag: str) -> str | None:
    """The value of `flag` in the pod's first container's args, as `--flag=value` (how the
    operator renders them) or `--flag value`; None when absent."""
    args = pod["spec"]["containers"][0].get("args") or []
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def serve_tiny(
    model_dir: Path,
    *server_args: str,
    extra_args: Callable[[dict], Sequence[str]] | None = None,
) -> tuple[Serve, Callable, Ready]:
    """(serve, stop_server, ready) for Node: a real `kvpilot serve` of a tiny model per pod,
    named as the pod's container asks (the gateway routes by it), or "tiny". `extra_args(pod)`
    adds flags for one pod. Started here with live_server's tiny_flags, not by start_tiny_server:
    that returns once the server answers, and until then nobody could stop the process."""
    from kvpilot_testing.live_server import stop_server, tiny_flags

    def serve(address: str, pod: dict) -> subprocess.Popen:
        name = container_flag(pod, "--served-model-name") or "tiny"
        more = extra_args(pod) if extra_args is not None else ()
        cmd = [sys.executable, "-m", "kvpilot_common.cli", "serve", "--host", address]
        cmd += ["--port", str(PORT), *tiny_flags(model_dir, *server_args, *more, name=name)]
        # A file, not a pipe: a chatty server must never block on a full pipe buffer.
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by stop_server
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        process.log = log  # type: ignore[attr-defined]  # where stop_server finds it
        return process

    def ready(process: subprocess.Popen, address: str) -> bool:
        if process.poll() is not None:
            process.log.seek(0)  # type: ignore[attr-defined]
            log = process.log.read()[-2000:]  # type: ignore[attr-defined]
            raise RuntimeError(f"kvpilot serve exited: {log}")
        try:
            answered = httpx.get(f"http://{address}:{PORT}/health", timeout=1.0)
        except httpx.HTTPError:
            return False
        # By this server: one of another test run that took the address first answers too,
        # and this one then exits (address in use), which the next probe reports.
        return answered.status_code == 200 and _listening(process.pid, address)

    return serve, stop_server, ready


def _listening(pid: int, address: str) -> bool:
    """Whether process `pid` holds the socket listening on `address` and the pod port."""
    local = f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}:{PORT:04X}"
    with open("/proc/net/tcp") as table:  # local address, remote, state (0A: listen), inode
        rows = [line.split() for line in table.readlines()[1:]]
    listeners = {f"socket:[{row[9]}]" for row in rows if row[1] == local and row[3] == "0A"}
    with contextlib.suppress(OSError):  # an fd closed meanwhile, or the process gone: next pass
        return any(os.readlink(fd) in listeners for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False
