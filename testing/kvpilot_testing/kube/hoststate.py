"""The host state a real test node (kube/realnode.py) must leave as it found it, and what it
reads to tell: the network (links, addresses, routes, packet filter rules, the sysctls a kubelet,
kube-proxy or the bridge plugin would change) and the few files written outside the node's
own folders."""

import os
import re
import shutil
import subprocess
from pathlib import Path

# Written outside the node's roots (no setting moves them): containerd's shim sockets, the CNI
# library's result cache, the kubelet's links to container logs. stop() removes what appeared.
HOST_PATHS = (Path("/run/containerd"), Path("/var/lib/cni"), Path("/var/log/containers"))
# Set by the kubelet at start (its kernel defaults); stop() puts the host's back.
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")


# The network namespaces `ip netns` pins: containerd's CRI makes one per pod sandbox here
# (cni-<uuid>), bind-mounted, which outlive a killed containerd.
NETNS = Path("/run/netns")


def netns_names() -> set[str]:
    return set(os.listdir(NETNS)) if NETNS.is_dir() else set()


def delete_new_netns(before: set[str]) -> None:
    """Those pinned since `before` (`ip netns del` unmounts, then removes)."""
    for name in sorted(netns_names() - before):
        run("ip", "netns", "del", name, check=False)


def entries() -> dict[Path, set[str] | None]:
    """What HOST_PATHS hold now (None: absent)."""
    return {p: set(os.listdir(p)) if p.is_dir() else None for p in HOST_PATHS}


def remove_new(before: dict[Path, set[str] | None]) -> None:
    """What appeared in HOST_PATHS since `before`: the whole folder if it was absent."""
    for path, entries in before.items():
        if entries is None:
            shutil.rmtree(path, ignore_errors=True)
            continue
        for name in set(os.listdir(path)) - entries if path.is_dir() else ():
            target = path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)


def host_state() -> dict[str, str]:
    """What the node must leave as it found it: the host's links, addresses, routes, packet
    filter rules (traffic counters and the dump's timestamp comments left out), the sysctls
    a kubelet, kube-proxy or the bridge plugin would change, HOST_PATHS' entries and the
    pinned network namespaces."""
    counters = re.compile(r"\[\d+:\d+\]")

    def rules(*argv: str) -> str:
        if shutil.which(argv[0]) is None:
            return f"{argv[0]}: not installed"
        done = run(*argv, check=False)
        lines = [counters.sub("", x) for x in done.stdout.splitlines() if not x.startswith("#")]
        return "\n".join(lines) if done.returncode == 0 else f"unavailable: {done.stderr}"

    sysctls = (*KUBELET_SYSCTLS, "net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet")
    return {
        "links": run("ip", "-o", "link", "show").stdout,
        "addresses": run("ip", "-o", "address", "show").stdout,
        "routes": run("ip", "route", "show", "table", "all").stdout,
        "iptables": rules("iptables-save"),
        "ip6tables": rules("ip6tables-save"),
        "nftables": rules("nft", "list", "ruleset"),
        "sysctls": run("sysctl", *sysctls).stdout,
        "files": repr(entries()),
        "network namespaces": repr(sorted(netns_names())),
    }


def run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    """A command's output as text (kube/realnode.py runs its commands through this too)."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=check)
