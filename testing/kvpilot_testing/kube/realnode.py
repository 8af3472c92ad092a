"""One real node for the test cluster: Debian's containerd, runc and CNI plugins, with the kubelet
and kube-scheduler built from the control plane's pinned Kubernetes module
(`scripts/controlplane.sh` builds them; `scripts/node.sh` installs the Debian packages).

The node lives in a network namespace this harness creates and deletes: the pods' bridge, the
masquerading rules and ip_forward are that namespace's, never the host's. A veth pair joins it
to the host, NODE_IP inside and HOST_IP outside, where the API server binds (ControlPlane's
`address`) so that the kubelet and the pods reach it. containerd has its own root, state,
socket and runc root under the work directory; its config, the CNI config and the kubelet's
are files in tools/node/. Every process is started here and stopped by PID.

What a kubelet changes outside its namespace, and how stop() puts it back (kube/hoststate.py
reads the host's state to check): the kernel sysctls it insists on are restored; the
containers' processes are killed by the PIDs their cgroups list, and the cgroups (under /CGROUP
in each v1 hierarchy) removed; the mounts under the work directory (pod volumes, image
snapshots) are unmounted; files that appeared in hoststate.HOST_PATHS are removed."""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from kvpilot_testing.kube import hoststate
from kvpilot_testing.kube.controlplane import (
    ADMIN_TOKEN,
    BIN_DIR,
    ControlPlane,
    ControlPlaneError,
    terminate,
)
from kvpilot_testing.kube.hoststate import run
from kvpilot_testing.paths import ROOT

CONFIGS = ROOT / "tools" / "node"
NODE_NAME = "kvpilot-node"
NAMESPACE = "kvpilot-node"  # the network namespace, under /run/netns
HOST_IP, NODE_IP = "10.77.0.1", "10.77.0.2"  # the veth pair, a /30 of its own
POD_CIDR = "10.78.0.0/24"
CGROUP = "kvpilot-node"
HOST_LINK, NODE_LINK = "kvpilot-h0", "kvpilot-n0"
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"  # built from Kubernetes' pause.c (kube/images.py)
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
HOST_COMMANDS = ("containerd", "runc", "ctr", "nsenter", "ip")


def render(template: Path, **values: str) -> str:
    """A config file from tools/node with its {name} placeholders filled (JSON and TOML keep
    their own braces: only {lowercase_name} is a placeholder)."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: values[m[1]], template.read_text())


class RealNode:
    """Started by start() beside a running ControlPlane whose address is HOST_IP (which must
    exist first: call create_network() before the control plane starts), stopped by stop()."""

    def __init__(self, workdir: Path, plane: ControlPlane, bin_dir: Path = BIN_DIR) -> None:
        self.dir, self.plane, self.bin = workdir, plane, bin_dir
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []
        self.sysctls: dict[str, str] = {}
        self.host_entries: dict[Path, set[str] | None] = {}
        self.netns_before: set[str] | None = None  # None: never started
        self.socket = workdir / "containerd.sock"

    # -- the network namespace ----------------------------------------------------------------

    @staticmethod
    def create_network() -> None:
        """The namespace and the veth pair; HOST_IP answers on the host once this returns."""
        delete_network()  # a run killed before its stop() left them
        run("ip", "netns", "add", NAMESPACE)
        run("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", NODE_LINK)
        run("ip", "link", "set", NODE_LINK, "netns", NAMESPACE)
        run("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_LINK)
        run("ip", "link", "set", HOST_LINK, "up")
        inside = ("ip", "-n", NAMESPACE)
        run(*inside, "addr", "add", f"{NODE_IP}/30", "dev", NODE_LINK)
        run(*inside, "link", "set", NODE_LINK, "up")
        run(*inside, "link", "set", "lo", "up")
        run(*inside, "route", "add", "default", "via", HOST_IP)

    # -- start and stop -----------------------------------------------------------------------

    def start(self, images: list[Path] = ()) -> None:
        """containerd with `images` (OCI archives, kube/images.py) imported, the scheduler,
        the kubelet; returns once the node is Ready."""
        missing = [b for b in NODE_BINARIES if not (self.bin / b).is_file()]
        if missing:
            names = ", ".join(missing)
            raise ControlPlaneError(f"{names} not in {self.bin}: run scripts/controlplane.sh")
        absent = [c for c in HOST_COMMANDS if shutil.which(c) is None]
        if absent:
            raise ControlPlaneError(f"{', '.join(absent)} not installed: run scripts/node.sh")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sysctls = {k: run("sysctl", "-n", k).stdout.strip() for k in hoststate.KUBELET_SYSCTLS}
        self.host_entries = hoststate.entries()
        self.netns_before = hoststate.netns_names()
        values = {"root": str(self.dir), "cni_bin": str(CNI_BIN), "sandbox_image": SANDBOX_IMAGE}
        values |= {"pod_cidr": POD_CIDR, "node_ip": NODE_IP, "cgroup": CGROUP}
        (self.dir / "cni").mkdir(exist_ok=True)
        (self.dir / "containerd.toml").write_text(render(CONFIGS / "containerd.toml", **values))
        (self.dir / "cni" / "10-kvpilot.conflist").write_text(
            render(CONFIGS / "cni.conflist", **values)
        )
        (self.dir / "kubelet.yaml").write_text(render(CONFIGS / "kubelet.yaml", **values))
        _create_cgroups()
        self._start("containerd", ["containerd", "--config", self.dir / "containerd.toml"])
        self.plane.wait_for("containerd's socket", self.socket.exists, 30)
        for archive in images:
            self.import_image(archive)
        kubeconfig = self.plane.write_kubeconfig(self.dir / "kubeconfig", ADMIN_TOKEN)
        self._start(
            "kube-scheduler",
            [
                self.bin / "kube-scheduler",
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "-v=1",
            ],
            in_namespace=False,
        )
        self._start(
            "kubelet",
            [
                self.bin / "kubelet",
                f"--config={self.dir / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "-v=1",
            ],
        )
        self._start(
            "kube-proxy",
            [
                self.bin / "kube-proxy",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={POD_CIDR}",
                # 0: leave the kernel's conntrack table size and TCP timeouts as they are (they
                # are not all per network namespace).
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "-v=1",
            ],
        )
        self.plane.wait_for("the node to be Ready", self.ready, 90)

    def import_image(self, archive: Path) -> None:
        """An OCI archive (kube/images.py) into containerd's k8s.io namespace, the one the
        kubelet's CRI sees, unpacked for its snapshotter."""
        run(*self.import_command(archive))

    def import_command(self, archive: Path) -> list[str]:
        """The command import_image runs (kube/background.py runs it in the background)."""
        return [
            "ctr",
            "--address",
            str(self.socket),
            "-n",
            "k8s.io",
            "images",
            "import",
            str(archive),
        ]

    def ready(self) -> bool:
        node = self.plane.get(f"/api/v1/nodes/{NODE_NAME}") or {}
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _start(self, name: str, argv: list, in_namespace: bool = True) -> None:
        log = self.dir / f"{name}.log"
        prefix = ["nsenter", f"--net=/run/netns/{NAMESPACE}", "--"] if in_namespace else []
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*prefix, *map(str, argv)], stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append((name, process, log))
        self.plane.processes.append((name, process, log))  # its wait_for watches them too

    def stop(self) -> None:
        """Every step runs even when one before it fails, the sysctls first put back. The
        network stays: delete_network() once the control plane has stopped too (its API server,
        bound to HOST_IP, deletes its lease through that address as it stops, and with the
        address gone waits out a timeout of its own before it exits)."""
        try:
            for key, value in self.sysctls.items():
                run("sysctl", "-w", f"{key}={value}", check=False)
            for name, process, _ in reversed(self.processes):
                if name == "containerd":
                    self._kill_containers()  # before containerd: its shims outlive it otherwise
                terminate(process)
                self.plane.processes[:] = [p for p in self.plane.processes if p[1] is not process]
            self.processes.clear()
            self._kill_containers()
        finally:
            try:
                _unmount_under(self.dir)
                _remove_cgroups()
                # Its images, unpacked: gigabytes a run with the server image, which pytest's
                # kept temporary folders would otherwise hold three times over. Logs stay. rm,
                # not shutil.rmtree: tens of thousands of files, a few times faster in C, and
                # never across into a file system still mounted below.
                stores = [self.dir / s for s in ("containerd", "containerd-state", "kubelet")]
                run("rm", "-rf", "--one-file-system", *stores, check=False)
            finally:
                if self.netns_before is not None:
                    hoststate.delete_new_netns(self.netns_before)  # the pods' sandboxes'
                hoststate.remove_new(self.host_entries)

    def _kill_containers(self) -> None:
        """The containers' processes (listed by their cgroups) and containerd's shims for this
        socket, by PID."""
        pids = set(_cgroup_pids())
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"containerd-shim" in cmdline and str(self.socket).encode() in cmdline:
                    pids.add(int(proc.name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _create_cgroups() -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy (it must exist); cpuset's with its
    parent's CPUs and memory nodes, which a new cpuset does not inherit."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not (hierarchy / "cgroup.procs").exists():
            continue  # not a mounted hierarchy
        (hierarchy / CGROUP).mkdir(exist_ok=True)
        for inherited in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / inherited).exists():
                value = (hierarchy / inherited).read_text()
                (hierarchy / CGROUP / inherited).write_text(value)


def _hierarchies() -> list[Path]:
    return [p / CGROUP for p in Path("/sys/fs/cgroup").iterdir() if (p / CGROUP).is_dir()]


def _groups(root: Path) -> list[Path]:
    """root and every cgroup below it, deepest first; one that goes while listed is skipped."""
    return sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> list[int]:
    pids = []
    for root in _hierarchies():
        for group in _groups(root):
            with contextlib.suppress(OSError):
                pids += [int(line) for line in (group / "cgroup.procs").read_text().split()]
    return pids


def _remove_cgroups() -> None:
    """Deepest first (a cgroup with children cannot go), trying for a while as killed processes
    finish leaving them."""
    for _ in range(50):
        for root in _hierarchies():
            for group in _groups(root):
                with contextlib.suppress(OSError):
                    group.rmdir()
        if not _hierarchies():
            return
        time.sleep(0.1)


def _unmount_under(directory: Path) -> None:
    """Every mount point under directory, deepest first (mountinfo's fifth field)."""
    prefix = str(directory.resolve()) + "/"
    points = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(prefix)
    ]
    for point in sorted(set(points), key=len, reverse=True):
        run("umount", "-l", point, check=False)


def delete_network() -> None:
    """The namespace (its bridge and veth end go with it, and the host's end with its peer)."""
    run("ip", "netns", "del", NAMESPACE, check=False)
    run("ip", "link", "del", HOST_LINK, check=False)
