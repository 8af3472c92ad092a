"""A real Prometheus for the monitoring tests: installed by scripts/install-prometheus.sh, started
on a free 127.0.0.1 port with a temporary data directory, stopped by PID."""

import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from kvpilot_testing.live_server import free_port, terminate

ROOT = Path(__file__).parents[2]
INSTALL = ROOT / "scripts" / "install-prometheus.sh"


def install() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`, installing Debian's package the first time."""
    done = subprocess.run(
        ["bash", str(INSTALL)], capture_output=True, text=True, timeout=900, check=False
    )
    found = shutil.which("prometheus"), shutil.which("promtool")
    if done.returncode or not all(found):
        raise RuntimeError(f"{INSTALL.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return found  # type: ignore[return-value]


class Prometheus:
    """`prometheus` scraping `scrape_configs` every second and evaluating `rule_files`."""

    def __init__(self, binary: str, scrape_configs: list[dict], rule_files: list[Path]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvpilot-prometheus-"))
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.log = (self.dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.base, timeout=10.0)
        try:
            self._wait_ready(timeout=30.0)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.logs()}")
            try:
                if self.http.get("/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready in {timeout} s: {self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return (self.dir / "prometheus.log").read_text()[-3000:]

    def stop(self) -> None:
        terminate(self.proc, grace=10.0)
        self.http.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def api(self, path: str, **params: str) -> dict:
        """/api/v1/<path>'s data; raises with Prometheus' message on an error."""
        response = self.http.get(f"/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector (scalars come back as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def wait_for(self, expr: str, timeout: float) -> list[dict]:
        """Poll until `expr` returns a sample; the result, or [] at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.2)


class PromQLError(RuntimeError):
    pass


def finite(result: list[dict]) -> bool:
    """At least one sample is a number (not NaN or ±Inf)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)
