"""The real `kvpilot gateway` as a subprocess on 127.0.0.1, watching one namespace of the real
control plane under the kubeconfig it is given (or, with neither, routing to the --backend
servers its args name, with no Kubernetes in its environment), started and stopped by PID."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from kvpilot_testing.kube.cluster import wait_for
from kvpilot_testing.live_server import free_port, terminate


class Gateway:
    def __init__(
        self,
        kubeconfig: Path | None,
        namespace: str | None,
        log: Path,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig, self.namespace, self.log_path = kubeconfig, namespace, log
        self.args, self.extra_env = args, env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Gateway":
        cmd = [sys.executable, "-m", "kvpilot_common.cli", "gateway", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), *self.args]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["POD_NAME"] = "gateway-test-0"
        if self.namespace is not None:
            cmd += ["--namespace", self.namespace]
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        env |= self.extra_env
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {self.log()[-2000:]}")
            try:
                return httpx.get(f"{self.url}/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        # Polled often: a refused connection costs nothing, and every test waits on this.
        wait_for("the gateway to be ready", ready, timeout=timeout, interval=0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: a crash, no drain."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def terminate(self) -> None:
        """SIGTERM: the gateway drains."""
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, grace=20)
            self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metric(self, name: str, **labels: str) -> float:
        """The sum of one metric's samples whose labels include `labels`."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total
