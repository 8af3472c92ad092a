"""The chart on a real control plane of its own: installed with the real `helm`, and the
operator run exactly as the installed Deployment says (its command, args and env, read back
from the API server) under a token of the chart's ServiceAccount, so only the chart's RBAC
applies to it. The audit log then tells which calls it made and what the API server answered.

A control plane of their own, not the session's `kube`: these tests upgrade, re-scope and
uninstall the release, which changes the CRD and the RBAC for everyone on that plane. One for
all the chart modules of a session (tests/chart/conftest.py), one release at a time: each
module installs its own and leaves the plane as it found it (every plane start costs seconds).
The release's name and namespace are the same every time (the kept CRD belongs to them), so a
module's audit events are the ones received since its install (`Installed.since`)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from kvpilot_testing.kube.cluster import EVENTS, MD, MERGE, PODS, wait_for
from kvpilot_testing.kube.controlplane import ControlPlane, ControlPlaneError
from kvpilot_testing.kube.install import NAMESPACE, RELEASE, Installed, helm, install
from kvpilot_testing.kube.operator import answers
from kvpilot_testing.live_server import free_port, terminate

# The Deployment's `command: [kvpilot]`: the console script of the venv the tests run in.
KVPILOT = Path(sys.executable).parent / "kvpilot"
OPERATOR = f"{RELEASE}-operator"  # the Deployment's and the ServiceAccount's name
# Only these two may differ from the chart's args: its ports (8080, 9090) are on every
# address, and another test or operator may hold them.
OVERRIDABLE = ("--liveness", "--metrics-port")


class ChartPlane:
    """The chart tests' control plane: started with the first release, stopped by stop()."""

    def __init__(self, workdir: Path) -> None:
        self.plane = ControlPlane(workdir)
        self.started = False
        self.failed: ControlPlaneError | None = None

    @contextmanager
    def release(self, *values: str) -> Iterator[Installed]:
        """The chart installed (`values`: helm flags, none: the chart's defaults); removed after,
        with what its tests left. The controller manager starts after the first install so that
        its garbage collector knows the CRD from the start (it rediscovers resources only every
        30 s); the CRD stays for the later releases (helm keeps it, and they adopt it)."""
        if self.failed is not None:  # once is enough: every start would wait it out
            raise self.failed
        first = not self.started
        if first:
            self.started = True
            try:
                self.plane.start(controller_manager=False)
            except ControlPlaneError as exc:
                self.failed = exc
                raise
        try:  # cleared even when the install fails half way, so that no later module fails
            installed = install(self.plane, *values)
            if first:
                self.plane.start_controller_manager()
            yield installed
        finally:
            self._clear()

    def _clear(self) -> None:
        """What a module leaves that the next one could meet: its ModelDeployments (with kopf's
        finalizer if its operator stopped first), the release, the pods of both (a pod bound
        to a node gone with its test waits for a kubelet to finish deleting it), the Events and
        kopf's peering objects of the release namespace. The namespace stays: deleting one
        takes 5 s (the namespace controller waits that long before it starts)."""
        with self.plane.client() as http:
            for md in _items(http, MDS):
                path = MD.format(ns=md["metadata"]["namespace"]) + f"/{md['metadata']['name']}"
                http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE)
                http.delete(path)
            wait_for("the ModelDeployments to go", lambda: not _items(http, MDS), timeout=30)
            helm(self.plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--ignore-not-found")
            pods = PODS.format(ns=NAMESPACE)

            def no_pods() -> bool:  # the garbage collector deletes them; bound ones wait
                left = _items(http, pods)
                for pod in left:
                    if pod["metadata"].get("deletionTimestamp"):  # as a kubelet finishes it
                        path = f"{pods}/{pod['metadata']['name']}"
                        http.request("DELETE", path, json={"gracePeriodSeconds": 0})
                return not left

            wait_for("the release namespace's pods to go", no_pods, timeout=30)
            http.delete(EVENTS.format(ns=NAMESPACE)).raise_for_status()
            peerings = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings"
            if http.get(peerings).status_code == 200:  # the CRD is there (kept once installed)
                http.delete(peerings).raise_for_status()

    def stop(self) -> None:
        self.plane.stop()


MDS = MD.replace("/namespaces/{ns}", "")  # in every namespace


def _items(http: httpx.Client, path: str) -> list[dict]:
    return http.get(path).raise_for_status().json()["items"]


def operator_container(plane: ControlPlane) -> dict:
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{OPERATOR}"
    deployment = plane.get(path)
    assert deployment is not None, f"no Deployment {NAMESPACE}/{OPERATOR}"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def operator_command(container: dict, liveness: str, metrics_port: int) -> list[str]:
    """The container's command line with only the ports replaced; fails on anything this
    cannot run as the pod would (another command, an arg it does not pass)."""
    assert container["command"] == ["kvpilot"], container["command"]
    replaced = {"--liveness": liveness, "--metrics-port": str(metrics_port)}
    args = []
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        if flag in replaced:
            arg = f"{flag}={replaced.pop(flag)}"
        args.append(arg)
    assert not replaced, f"the chart no longer passes {sorted(replaced)}"
    return [str(KVPILOT), *args]


def operator_env(container: dict, pod: str) -> dict[str, str]:
    """The container's env; of valueFrom only the pod's own name (`pod`) can be played."""
    env = {}
    for var in container.get("env", []):
        field = (var.get("valueFrom") or {}).get("fieldRef") or {}
        if field.get("fieldPath") == "metadata.name":  # the API server adds apiVersion: v1
            env[var["name"]] = pod
            continue
        assert "value" in var, f"{var['name']}: valueFrom cannot be played here"
        env[var["name"]] = var["value"]
    return env


class ChartOperator:
    """`kvpilot operator` as the installed Deployment runs it. `env` adds variables on top of
    the chart's; the process gets no other environment than PATH, PYTHONPATH (the code under
    test) and the kubeconfig, as a container gets none of the test's."""

    def __init__(
        self,
        installed: Installed,
        log: Path,
        env: dict[str, str] | None = None,
        pod: str = f"{OPERATOR}-0",
    ):
        self.installed, self.log_path, self.extra_env = installed, log, env or {}
        self.pod = pod  # the name of the pod it plays
        self.process: subprocess.Popen | None = None
        self.liveness = ""
        self.metrics_port = 0
        self.argv: list[str] = []
        self.started = self.stopped = datetime.now(UTC)

    def start(self) -> None:
        container = operator_container(self.installed.plane)
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        self.metrics_port = free_port()
        self.argv = operator_command(container, self.liveness, self.metrics_port)
        env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
        env |= operator_env(container, self.pod) | self.extra_env
        env["KUBECONFIG"] = str(self.installed.operator_kubeconfig)
        self.started = datetime.now(UTC)
        with self.log_path.open("ab") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.argv, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_for("the operator's liveness endpoint", self._alive, timeout=60, interval=0.2)

    def _alive(self) -> bool:
        assert self.process is not None
        return answers(self.process, self.liveness)

    def stop(self) -> None:
        if self.process is None:
            return
        terminate(self.process, grace=20)
        self.process = None
        self.stopped = datetime.now(UTC)

    def kill(self) -> None:
        """SIGKILL by PID: no clean exit (a lost node, an OOM kill)."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        self.process = None
        self.stopped = datetime.now(UTC)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def events(self) -> list[dict]:
        """The audit events of the requests this run of the operator made (received between
        its start and its stop, or now while it runs)."""
        until = self.stopped if self.process is None else datetime.now(UTC)
        return [
            event
            for event in self.installed.plane.audit(self.installed.operator_user)
            if self.started <= _received(event) <= until
        ]


def operator_events(installed: Installed) -> list[dict]:
    """The audit events of the release's operator ServiceAccount, every run of it since the
    install (not an earlier release's of the same name)."""
    user = installed.operator_user
    return [e for e in installed.plane.audit(user) if _received(e) >= installed.since]


def _received(event: dict) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"])


def forbidden(events: list[dict]) -> list[str]:
    """'VERB URI' of every request the API server refused with 403."""
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in events
        if e.get("responseStatus", {}).get("code") == 403
    ]


@dataclass(frozen=True)
class Call:
    """A request as the API server's authorizer sees it; namespace None: cluster-wide."""

    api_group: str
    resource: str  # plural, or plural/subresource
    verb: str
    namespace: str | None


def calls(event: dict) -> list[Call]:
    """The authorization attributes of a resource request; none for a non-resource one
    (discovery, /version: readable by every authenticated client, no rule needed). A patch
    that created its object (201: server-side apply of a missing object) was authorized as
    `create` too, a check the audit log shows only through that status."""
    ref = event.get("objectRef")
    if ref is None:
        return []
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    made = Call(ref.get("apiGroup", ""), resource, event["verb"], ref.get("namespace"))
    if made.verb == "patch" and event.get("responseStatus", {}).get("code") == 201:
        return [made, Call(made.api_group, made.resource, "create", made.namespace)]
    return [made]


def non_resource(events: list[dict]) -> set[str]:
    """The paths of the non-resource requests: there must be only discovery and /version."""
    return {e["requestURI"].split("?")[0] for e in events if "objectRef" not in e}


def is_public(path: str) -> bool:
    """Discovery (/api, /api/v1, /apis, /apis/GROUP[/VERSION]) and /version, which the
    system:discovery and system:public-info-viewer ClusterRoles grant everyone."""
    parts = path.strip("/").split("/")
    return (
        parts == ["version"]
        or (parts[0] == "api" and len(parts) <= 2)
        or (parts[0] == "apis" and len(parts) <= 3)
    )
