"""The real `kvpilot operator` as a subprocess, run as the chart runs it under the kubeconfig it
is given (the chart's ServiceAccount, so the chart's RBAC applies to every call it makes), and
the session's shared one.

The shared operator watches every namespace whose name starts with WATCHED (a kopf namespace
pattern), not all of them: many live tests need a namespace no operator touches (the gateway's
tests that make their pods by hand, the in-process handler tests), and kopf cannot leave a
namespace out of an all-namespaces watch. A test that restarts, kills or reconfigures the
operator runs a private one that watches its own namespace only."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from kvpilot_testing.kube.cluster import (
    Cluster,
    create_namespace,
    delete_namespace,
    namespace_name,
    wait_for,
)
from kvpilot_testing.kube.install import Installed
from kvpilot_testing.live_server import free_port, terminate

WATCHED = "op-"  # the namespaces the shared operator watches: op-<test>-<n>


def answers(process: subprocess.Popen | None, liveness: str) -> bool:
    """Whether an operator's liveness endpoint answers; an operator that exited is an error."""
    if process is not None and process.poll() is not None:
        raise RuntimeError(f"the operator exited with {process.returncode}")
    try:
        return httpx.get(liveness, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Operator:
    """`metrics_port` 0: no /metrics. `namespaces`: kopf namespace names or patterns."""

    def __init__(
        self, kubeconfig: Path, log: Path, namespaces: tuple[str, ...], metrics_port: int = 0
    ) -> None:
        self.kubeconfig, self.log_path = kubeconfig, log
        self.namespaces, self.metrics_port = namespaces, metrics_port
        self.liveness = ""
        self.process: subprocess.Popen | None = None

    def start(self) -> "Operator":
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KVPILOT_IMAGE": "kvpilot:test"}
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        cmd = [sys.executable, "-m", "kvpilot_common.cli", "operator"]
        cmd += [f"--namespace={n}" for n in self.namespaces]
        cmd += ["--liveness", self.liveness, "--metrics-port", str(self.metrics_port)]
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait(self) -> None:
        """Until kopf runs (its liveness endpoint answers). A real API server hands the
        operator, when it starts watching, every object made before: nothing else to wait for."""
        wait_for("the operator's liveness endpoint", self.alive, timeout=60, interval=0.1)

    def alive(self) -> bool:
        return answers(self.process, self.liveness)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, grace=20)
        self.process = None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int, about: str = "") -> str:
        """The log written after `offset`; with `about`, only its lines that name it (the
        shared operator's lines of one test's namespace)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return "".join(line for line in text.splitlines(True) if about in line)


@contextmanager
def namespace(installed: Installed, test: str, watched: bool) -> Iterator[Cluster]:
    """A fresh namespace of the session's control plane for one test, `watched` by the shared
    operator or by none. Afterwards its ModelDeployments are deleted and gone (with the shared
    operator's finalizer handled by it, which must still be alive then) and the namespace too,
    so what one test leaves cannot reach the next."""
    shared = installed.operator
    assert not watched or shared is not None, "the session has no shared operator"
    cluster = Cluster(installed.plane, namespace_name(test, WATCHED if watched else ""),
                      installed.operator_kubeconfig)  # fmt: skip
    cluster.shared = watched
    offset = shared.log_size() if watched and shared is not None else 0
    create_namespace(installed.plane, cluster.ns)
    try:
        yield cluster
        cluster.delete_model_deployments()
        if watched and shared is not None:
            assert shared.alive(), "the shared operator stopped answering"
    finally:
        if watched and shared is not None:
            print(shared.log_since(offset, f'"{cluster.ns}"')[-3000:])  # shown if it fails
        cluster.stop_operator()
        delete_namespace(cluster)
        cluster.close()
