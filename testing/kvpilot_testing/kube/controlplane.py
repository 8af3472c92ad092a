"""A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver and
kube-controller-manager, the binaries scripts/controlplane.sh builds from pinned Go modules.

No scheduler and no kubelet: kube/node.py plays the node. The API server enables the
OwnerReferencesPermissionEnforcement admission plugin (off by default, on in OpenShift), so an
operator without `modeldeployments/finalizers` fails here as it would there, and writes an
audit log of every request that is not a control-plane component's, so tests can see exactly
which calls the operator made and what the API server answered."""

import json
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvpilot_testing.live_server import free_port

BIN_DIR = (
    Path(os.environ.get("KVPILOT_TOOLS_CACHE", Path.home() / ".cache/kvpilot/controlplane")) / "bin"
)
ADMIN_TOKEN = "kvpilot-admin-token"  # static and test-only; the admin is in system:masters
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
# The controller manager's loops that need a cloud only log here; node lifecycle only where a
# real kubelet runs (it lifts the not-ready taint a kubelet registers its node with).
CONTROLLERS = "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route"
WITHOUT_NODES = ",-nodelifecycle"
# Control-plane components make most of the requests; the audit log keeps everybody else's.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "users": ["system:kube-controller-manager", "system:apiserver"]},
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata"},
    ],
}


class ControlPlaneError(RuntimeError):
    pass


def terminate(process: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM, and SIGKILL if it has not exited within grace_s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the whole new one, never a part."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


class ControlPlane:
    """Started by start(), stopped (every process by PID) by stop(); files live in `workdir`."""

    def __init__(self, workdir: Path, bin_dir: Path = BIN_DIR, address: str = "127.0.0.1") -> None:
        """`address`: where the API server binds and what it advertises (its certificate is
        for it): loopback unless a real node's pods must reach it (kube/realnode.py), which
        also turns the node lifecycle controller on."""
        self.dir, self.bin, self.address = workdir, bin_dir, address
        self.controllers = CONTROLLERS + ("" if address != "127.0.0.1" else WITHOUT_NODES)
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []
        self.url = ""
        # The API server's self-signed certificate as it writes it, and the copy everybody
        # reads: made once a TLS handshake verified against it, by rename (never half there).
        self.served_cert = workdir / "pki" / "apiserver.crt"
        self.ca = workdir / "ca.crt"
        self.kubeconfig = workdir / "kubeconfig"  # the admin's
        self.audit_log = workdir / "audit.log"

    # -- start and stop -----------------------------------------------------------------------

    def start(self, controller_manager: bool = True) -> None:
        """`controller_manager` False: start it later with start_controller_manager(), after
        installing CRDs (its garbage collector rediscovers resources only every 30 s)."""
        missing = [b for b in BINARIES if not (self.bin / b).is_file()]
        if missing:
            raise ControlPlaneError(
                f"{', '.join(missing)} not in {self.bin}: run scripts/controlplane.sh "
                "(scripts/test.sh does) to build them from their pinned Go modules"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self._keys()
        etcd = self._start_etcd()
        self._start_apiserver(etcd)
        self.write_kubeconfig(self.kubeconfig, ADMIN_TOKEN)
        if controller_manager:
            self.start_controller_manager()

    def start_controller_manager(self) -> None:
        self._start("kube-controller-manager", self._controller_manager_args())
        # The serviceaccount controller makes 'default' in every namespace: the sign it works.
        self.wait_for(
            "the controller manager (the default ServiceAccount)",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default"),
            60,
        )

    def stop(self) -> None:
        for _, process, _ in reversed(self.processes):
            terminate(process)
        self.processes.clear()

    def _keys(self) -> None:
        key, public = self.dir / "sa.key", self.dir / "sa.pub"
        for argv in (
            ["openssl", "genrsa", "-out", key, "2048"],
            ["openssl", "rsa", "-in", key, "-pubout", "-out", public],
        ):
            subprocess.run(argv, check=True, capture_output=True)
        users = self.dir / "tokens.csv"
        users.write_text(f'{ADMIN_TOKEN},kvpilot-admin,kvpilot-admin,"system:masters"\n')
        (self.dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        with log.open("wb") as out:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [str(self.bin / name), *argv], stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append((name, process, log))
        return process

    def _start_etcd(self) -> str:
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        self._start(
            "etcd",
            [
                "--name=kvpilot",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=kvpilot={peer}",
                "--unsafe-no-fsync=true",  # tests only: nothing here must survive a crash
                "--log-level=warn",
            ],
        )
        self.wait_for("etcd /health", lambda: b'"true"' in httpx.get(client + "/health").content)
        return client

    def _start_apiserver(self, etcd: str) -> None:
        port = free_port()
        self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'pki'}",  # writes a self-signed cert for the address
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=RBAC",
                f"--token-auth-file={self.dir / 'tokens.csv'}",
                f"--service-account-key-file={self.dir / 'sa.pub'}",
                f"--service-account-signing-key-file={self.dir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                f"--audit-policy-file={self.dir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--enable-priority-and-fairness=false",
                # A real node's name resolves nowhere here: logs and exec go to its IP.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "-v=1",
            ],
        )
        self.url = f"https://{self.address}:{port}"
        self.wait_for("kube-apiserver /readyz over its whole certificate", self._ready, 90)

    def _ready(self) -> bool:
        """The API server writes its certificate file in place, not by rename, and it holds
        two certificates (the serving one, then its CA): a read can find it empty, or cut after
        the first, which loads but verifies nothing. So the bytes read count only once a TLS
        handshake verified against them and /readyz answered; then they go to self.ca by
        rename, and no reader ever opens the file the API server writes."""
        try:
            pem = self.served_cert.read_text()
            context = ssl.create_default_context(cadata=pem)
        except (OSError, ValueError):  # missing, empty, or a block cut short
            return False
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=self.url, verify=context, headers=headers, timeout=5) as http:
            if http.get("/readyz").status_code != 200:
                return False
        _write_atomically(self.ca, pem)
        return True

    def _controller_manager_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--service-account-private-key-file={self.dir / 'sa.key'}",
            f"--root-ca-file={self.ca}",
            "--use-service-account-credentials=true",
            f"--controllers={self.controllers}",
            # Its client's default rate limit (20 requests/s, bursts of 30) held its start for
            # 4-5 s: with --use-service-account-credentials it makes and reads a ServiceAccount
            # and a token for each of its ~40 controllers, one by one. One API server of its own
            # on loopback, nobody to protect: no limit (start to the default ServiceAccount
            # 5 s -> 0.5 s).
            "--kube-api-qps=1000",
            "--kube-api-burst=1000",
            "-v=1",
        ]

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Poll `check` until truthy; fail at once, with the log's end, if a process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process, log in self.processes:
                if process.poll() is not None:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise ControlPlaneError(
                        f"{name} exited with {process.returncode} while waiting for {what}; "
                        f"the end of {log}:\n{tail}"
                    )
            try:
                result = check()
            except httpx.HTTPError:
                result = None
            if result:
                return result
            time.sleep(0.1)
        raise ControlPlaneError(f"timed out after {timeout:g} s waiting for {what}")

    # -- clients ------------------------------------------------------------------------------

    def client(self, token: str = ADMIN_TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"}
        verify = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(base_url=self.url, verify=verify, headers=headers, timeout=30)

    def get(self, path: str) -> dict | None:
        with self.client() as http:
            response = http.get(path)
        if response.status_code != 200:
            return None
        return response.json() if "json" in response.headers.get("content-type", "") else {}

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        context = {"cluster": "kvpilot", "user": "user", "namespace": namespace}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kvpilot",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "kvpilot", "context": context}],
            "current-context": "kvpilot",
        }
        _write_atomically(path, yaml.safe_dump(config))  # an operator may be reading it
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 7200) -> str:
        """A token for a ServiceAccount from the TokenRequest API, as a kubelet mounts one."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        request["spec"] = {"expirationSeconds": seconds}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        with self.client() as http:
            return http.post(path, json=request).raise_for_status().json()["status"]["token"]

    def audit(self, user: str | None = None) -> Iterator[dict]:
        """The audit log's events (ResponseComplete and Panic stages), of one user if given."""
        if not self.audit_log.exists():
            return
        with self.audit_log.open() as lines:
            for line in lines:
                event = json.loads(line)
                if user is None or event.get("user", {}).get("username") == user:
                    yield event
