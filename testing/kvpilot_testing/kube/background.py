"""An image imported into the real node's containerd (kube/realnode.py) while the tests that do
not need it run: a server image's archive is gigabytes that containerd hashes, stores and
unpacks, and the session need not wait for that before the first test that runs the image."""

import subprocess
from pathlib import Path

from kvpilot_testing.kube.controlplane import ControlPlaneError, terminate
from kvpilot_testing.kube.realnode import RealNode


class BackgroundImport:
    """Started by the constructor; wait() before the image is used, stop() at the end (a no-op
    once it has finished)."""

    def __init__(self, node: RealNode, archive: Path) -> None:
        self.archive = archive
        self.log = node.dir / f"import-{archive.stem}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                node.import_command(archive), stdout=out, stderr=subprocess.STDOUT
            )

    def wait(self, timeout: float) -> None:
        """Returns once the import has ended well; raises with ctr's words if it failed."""
        code = self.process.wait(timeout)
        if code:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise ControlPlaneError(f"ctr import of {self.archive} exited with {code}: {tail}")

    def stop(self) -> None:
        """By its PID, if it still runs (a session that ended before any test needed it)."""
        terminate(self.process)
