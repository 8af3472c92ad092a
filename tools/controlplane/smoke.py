"""Smoke test of the binaries scripts/controlplane.sh builds: etcd + kube-apiserver
(+ kube-controller-manager) on 127.0.0.1 with free ports and a temporary directory, then
checks over HTTPS without kubectl: GET /version, the CRD applied through the apiextensions
API, a valid ModelDeployment accepted and invalid ones rejected by the CRD's CEL rules.
Everything is stopped by PID at the end. Standard library plus PyYAML and the openssl CLI.

    python3 tools/controlplane/smoke.py [--bin-dir DIR] [--keep]

The start-up here is what tools/controlplane/README.md documents for the pytest fixture.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "modeldeployments.kvpilot.dev.yaml"
TOKEN = "kvpilot-admin-token"  # static, test-only; the admin is in system:masters


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, server: str, ca: Path):
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(ca))

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {TOKEN}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                text = r.read()
                return r.status, json.loads(text) if text.strip().startswith(b"{") else {
                    "text": text.decode()
                }
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"text": text.decode(errors="replace")}


def wait(what: str, check, timeout: float, procs: list) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p, log in procs:
            if p.poll() is not None:
                sys.exit(f"{name} exited with {p.returncode} while waiting for {what}; see {log}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError):
            pass
        time.sleep(0.25)
    sys.exit(f"timed out after {timeout}s waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser()
    default_bin = (
        Path(os.environ.get("KVPILOT_TOOLS_CACHE", Path.home() / ".cache/kvpilot/controlplane"))
        / "bin"
    )
    ap.add_argument("--bin-dir", type=Path, default=default_bin)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-controller-manager", action="store_true")
    args = ap.parse_args()
    b = args.bin_dir

    tmp = Path(tempfile.mkdtemp(prefix="kvpilot-cp-"))
    procs: list = []
    t0 = time.monotonic()
    try:
        # Service-account key pair and the static admin token.
        subprocess.run(
            ["openssl", "genrsa", "-out", tmp / "sa.key", "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", tmp / "sa.key", "-pubout", "-out", tmp / "sa.pub"],
            check=True,
            capture_output=True,
        )
        (tmp / "tokens.csv").write_text(f'{TOKEN},kvpilot-admin,kvpilot-admin,"system:masters"\n')

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"

        def start(name: str, argv: list[str]) -> None:
            log = tmp / f"{name}.log"
            with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
                p = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            procs.append((name, p, log))
            print(f"started {name} pid {p.pid}: {' '.join(map(str, argv))}")

        start(
            "etcd",
            [
                b / "etcd",
                "--name=kvpilot",
                f"--data-dir={tmp / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kvpilot={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        wait(
            "etcd /health",
            lambda: b'"true"' in urllib.request.urlopen(etcd_url + "/health", timeout=2).read(),
            30,
            procs,
        )
        print(f"etcd healthy after {time.monotonic() - t0:.1f}s")

        cert_dir = tmp / "pki"
        start(
            "kube-apiserver",
            [
                b / "kube-apiserver",
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={cert_dir}",  # self-signed serving cert for localhost/127.0.0.1
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=RBAC",
                f"--token-auth-file={tmp / 'tokens.csv'}",
                f"--service-account-key-file={tmp / 'sa.pub'}",
                f"--service-account-signing-key-file={tmp / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--enable-priority-and-fairness=false",
                "-v=1",
            ],
        )
        server = f"https://127.0.0.1:{api_port}"
        ca = cert_dir / "apiserver.crt"
        wait("the serving certificate", ca.exists, 60, procs)
        api = Api(server, ca)
        wait("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, 90, procs)
        print(f"kube-apiserver ready after {time.monotonic() - t0:.1f}s")

        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "kvpilot",
                            "cluster": {"server": server, "certificate-authority": str(ca)},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [
                        {"name": "kvpilot", "context": {"cluster": "kvpilot", "user": "admin"}}
                    ],
                    "current-context": "kvpilot",
                }
            )
        )

        if not args.no_controller_manager:
            start(
                "kube-controller-manager",
                [
                    b / "kube-controller-manager",
                    f"--kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                    f"--service-account-private-key-file={tmp / 'sa.key'}",
                    f"--root-ca-file={ca}",
                    "--use-service-account-credentials=true",
                    # No nodes and no cloud here: the node and cloud controllers only log.
                    "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,"
                    "-service-lb-controller,-route",
                    "-v=1",
                ],
            )

        status, version = api.call("GET", "/version")
        assert status == 200, (status, version)
        print("GET /version:", version.get("gitVersion"), version.get("goVersion"))

        crd = yaml.safe_load(CRD.read_text())
        status, body = api.call(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
        )
        assert status == 201, (status, body)

        def established() -> bool:
            _, got = api.call(
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/modeldeployments.kvpilot.dev",
            )
            conds = {
                c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []
            }
            return (
                conds.get("Established") == "True"
                and api.call(
                    "GET", "/apis/kvpilot.dev/v1alpha1/namespaces/default/modeldeployments"
                )[0]
                == 200
            )

        wait("the CRD Established and served", established, 30, procs)
        print(f"CRD established after {time.monotonic() - t0:.1f}s")

        base = "/apis/kvpilot.dev/v1alpha1/namespaces/default/modeldeployments"

        def md(name: str, spec: dict) -> dict:
            return {
                "apiVersion": "kvpilot.dev/v1alpha1",
                "kind": "ModelDeployment",
                "metadata": {"name": name},
                "spec": spec,
            }

        status, body = api.call(
            "POST",
            base,
            md("smoke-valid", {"model": {"source": "builtin://smollm2-135m-instruct"}}),
        )
        assert status == 201, (status, body)
        print("valid ModelDeployment: 201, defaulted engine:", body["spec"].get("engine"))

        invalid = {
            "bad source (CEL on model.source)": md(
                "smoke-bad-source", {"model": {"source": "s3://bucket/x"}}
            ),
            "min > max (CEL on spec)": md(
                "smoke-min-max",
                {
                    "model": {"source": "builtin://smollm2-135m-instruct"},
                    "autoscaling": {
                        "enabled": True,
                        "minReplicas": 5,
                        "maxReplicas": 2,
                        "targetQueueDepth": 4,
                    },
                },
            ),
            "name > 40 (CEL on the object)": md(
                "x" * 41, {"model": {"source": "builtin://smollm2-135m-instruct"}}
            ),
        }
        for what, obj in invalid.items():
            status, body = api.call("POST", base, obj)
            assert status == 422, (what, status, body)
            print(f"invalid ({what}): 422 {body.get('message', '')[:200]}")

        if not args.no_controller_manager:
            # The controller manager's serviceaccount controller makes 'default' in each namespace.
            wait(
                "the controller manager (default ServiceAccount)",
                lambda: (
                    api.call("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
                ),
                60,
                procs,
            )
            print(f"kube-controller-manager working after {time.monotonic() - t0:.1f}s")
            # Deployment -> ReplicaSet -> Pod (Pending for good: no scheduler, no kubelet).
            labels = {"app": "smoke"}
            deployment = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "smoke"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "example.invalid/x"}]},
                    },
                },
            }
            status, body = api.call(
                "POST", "/apis/apps/v1/namespaces/default/deployments", deployment
            )
            assert status == 201, (status, body)
            wait(
                "a Pod from the Deployment",
                lambda: bool(
                    api.call("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dsmoke")[1][
                        "items"
                    ]
                ),
                60,
                procs,
            )
            print(f"Deployment made its Pod after {time.monotonic() - t0:.1f}s")
        print(f"SMOKE OK in {time.monotonic() - t0:.1f}s; kubeconfig {kubeconfig}")
    finally:
        for name, p, _ in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            print(f"stopped {name} pid {p.pid} (rc {p.returncode})")
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
