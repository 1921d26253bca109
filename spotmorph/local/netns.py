"""Making and removing a ``--netns`` cluster's network with ``ip`` and ``tc``; partitions and slow links.

What is made is recorded (``network-made.jsonl`` in the cluster directory) *before* it is made, so
``down`` after a crash knows it; ``down`` also sweeps every namespace and link bearing the cluster's
prefix, and kills whatever still runs in its namespaces first (a namespace with a process in it, and
its veth, outlive ``ip netns del``). The values (names, addresses, routes, qdisc arguments) are in
:mod:`spotmorph.local.network`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from morphing.errors import UserInputError
from spotmorph.local.layout import ClusterDir
from spotmorph.local.network import (
    NODE_INTERFACE,
    NetworkPlan,
    PartitionFrom,
    choose_subnet,
    netem_args,
    prefix_of,
    tbf_args,
)

CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
NETEM_MISSING = (
    "tc netem is not available in this kernel: the sch_netem module is missing (load it with "
    "`modprobe sch_netem`, or use a kernel built with CONFIG_NET_SCH_NETEM). --rate alone works without it "
    "(a tbf qdisc); --delay and --loss need netem"
)


class NetworkError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message quotes it and what it said."""


def _ip() -> str:
    found = shutil.which("ip")
    if found is None:
        raise UserInputError("--netns needs the `ip` command (iproute2), which is not on PATH: install iproute2")
    return found


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise NetworkError(f"`{' '.join(args)}` failed: {out.stderr.strip() or out.returncode}")
    return out


def _capabilities() -> int:
    """This process's effective capabilities (from /proc; all of them where there is no /proc)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return ~0


def require_rights(cluster_root: Path) -> None:
    """Exit 2 (a UserInputError) unless this process can make namespaces, veths and a bridge.

    Checks that ``ip`` exists and that the process holds CAP_NET_ADMIN and CAP_SYS_ADMIN, then makes and
    removes a namespace for real (a container may refuse it whatever the capabilities say)."""
    ip = _ip()
    caps = _capabilities()
    missing = [
        n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)) if not caps >> bit & 1
    ]
    if missing:
        raise UserInputError(
            "--netns makes network namespaces, veth pairs and a bridge, which needs root's CAP_NET_ADMIN and "
            f"CAP_SYS_ADMIN; this process (uid {os.geteuid()}) lacks {' and '.join(missing)}: run it as root "
            "with full capabilities (e.g. `sudo -E spotmorph local up --netns`), or drop --netns"
        )
    probe = f"{prefix_of(cluster_root)}-probe{os.getpid()}"  # two processes probing at once (xdist) never collide
    made = _run([ip, "netns", "add", probe], check=False)
    _run([ip, "netns", "del", probe], check=False)
    if made.returncode != 0:
        raise UserInputError(
            f"--netns: cannot create a network namespace here (`ip netns add` said: {made.stderr.strip()}); "
            "run as root on a host (or a privileged container), or drop --netns"
        )


def unavailable_reason() -> str | None:
    """Why ``--netns`` clusters cannot run on this machine (for tests to skip with), or None."""
    try:
        require_rights(Path(tempfile.gettempdir()) / "spotmorph-netns-check")
    except UserInputError as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def allocation_lock() -> Iterator[None]:
    """One cluster (or test topology, tests/ha/test_partition.py) at a time chooses a subnet and makes its bridge
    (another would see neither yet)."""
    with open(Path(tempfile.gettempdir()) / "spotmorph-netns.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _record(cluster: ClusterDir, kind: str, name: str) -> None:
    """Note a namespace or link in the cluster's record before making it."""
    with open(cluster.network_made, "a") as handle:
        handle.write(json.dumps({"kind": kind, "name": name}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def used_networks() -> list[str]:
    """Every IPv4 network this machine has an address or a route in."""
    ip = _ip()
    used = []
    with contextlib.suppress(ValueError):
        for link in json.loads(_run([ip, "-j", "-4", "addr", "show"]).stdout or "[]"):
            used += [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if "local" in a]
        for route in json.loads(_run([ip, "-j", "-4", "route", "show"]).stdout or "[]"):
            if route.get("dst") not in (None, "default"):
                used.append(str(route["dst"]))
    return used


def make_network(cluster: ClusterDir, subnet: str | None = None) -> NetworkPlan:
    """Choose the cluster's subnet, record it and make its bridge (the controller's and platform's addresses)."""
    ip = _ip()
    prefix = prefix_of(cluster.root)
    with allocation_lock():
        plan = NetworkPlan(prefix, choose_subnet(prefix, used_networks(), subnet))
        cluster.network_plan.write_text(plan.to_json())
        _record(cluster, "link", plan.bridge)
        _run([ip, "link", "add", plan.bridge, "address", plan.bridge_mac, "type", "bridge"])
        for address in (plan.controller_address, plan.platform_address):
            _run([ip, "addr", "add", f"{address}/{plan.network.prefixlen}", "dev", plan.bridge])
        _run([ip, "link", "set", plan.bridge, "up"])
    return plan


def load_plan(cluster: ClusterDir) -> NetworkPlan | None:
    """The cluster's network, or None for a cluster on loopback."""
    try:
        return NetworkPlan.from_json(cluster.network_plan.read_text())
    except (OSError, ValueError, KeyError):
        return None


def add_vm(cluster: ClusterDir, plan: NetworkPlan, serial: int) -> None:
    """Make VM ``serial``'s namespace, its veth pair on the bridge and its address."""
    ip, namespace, veth = _ip(), plan.namespace(serial), plan.veth(serial)
    address = f"{plan.vm_address(serial)}/{plan.network.prefixlen}"
    _record(cluster, "netns", namespace)
    _record(cluster, "link", veth)
    _run([ip, "netns", "add", namespace])
    _run([ip, "link", "add", veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", namespace])
    _run([ip, "link", "set", veth, "master", plan.bridge, "up"])
    _run([ip, "-n", namespace, "addr", "add", address, "dev", NODE_INTERFACE])
    _run([ip, "-n", namespace, "link", "set", NODE_INTERFACE, "up"])
    _run([ip, "-n", namespace, "link", "set", "lo", "up"])


def exec_prefix(namespace: str) -> list[str]:
    """The command line prefix that runs a command inside ``namespace``."""
    return [_ip(), "netns", "exec", namespace]


def split_exec_prefix(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the namespace, the command) of a command line :func:`exec_prefix` began; (None, it) for any other."""
    if len(args) > 4 and Path(args[0]).name == "ip" and list(args[1:3]) == ["netns", "exec"]:
        return args[3], list(args[4:])
    return None, list(args)


def leftovers(prefix: str) -> tuple[list[str], list[str]]:
    """Namespaces and links bearing ``prefix`` (none where there is no ``ip``)."""
    ip = shutil.which("ip")
    if ip is None:
        return [], []
    names = [line.split()[0] for line in _run([ip, "netns", "list"], check=False).stdout.splitlines() if line.strip()]
    links = []
    with contextlib.suppress(ValueError):
        links = [link["ifname"] for link in json.loads(_run([ip, "-j", "link", "show"], check=False).stdout or "[]")]
    mine = f"{prefix}-"
    return [n for n in names if n.startswith(mine)], [n for n in links if n.startswith(mine)]


def _recorded(cluster: ClusterDir) -> tuple[list[str], list[str]]:
    namespaces: list[str] = []
    links: list[str] = []
    with contextlib.suppress(OSError):
        for line in cluster.network_made.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                (namespaces if entry["kind"] == "netns" else links).append(str(entry["name"]))
    return namespaces, links


def teardown(cluster: ClusterDir, settle_seconds: float = 10.0) -> list[str]:
    """Remove every namespace (killing what still runs in it) and link the cluster made; returns their names.

    A veth goes with its namespace, a little after it; this waits until nothing bearing the prefix is left
    (a NetworkError naming what is, after ``settle_seconds``)."""
    prefix = prefix_of(cluster.root)
    recorded_ns, recorded_links = _recorded(cluster)
    swept_ns, swept_links = leftovers(prefix)
    ip = shutil.which("ip")
    if ip is None:
        return []
    removed = []
    for namespace in dict.fromkeys([*recorded_ns, *swept_ns]):
        if namespace not in swept_ns:
            continue
        for pid in _run([ip, "netns", "pids", namespace], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run([ip, "netns", "del", namespace])
        removed.append(namespace)
    for link in dict.fromkeys([*recorded_links, *swept_links]):
        if link in swept_links and _run([ip, "link", "del", link], check=False).returncode == 0:
            removed.append(link)
    deadline = time.monotonic() + settle_seconds
    while any(left := leftovers(prefix)):
        if time.monotonic() > deadline:
            raise NetworkError(f"could not remove {', '.join(left[0] + left[1])} (run `spotmorph local down` again)")
        for link in left[1]:
            _run([ip, "link", "del", link], check=False)
        time.sleep(0.1)
    return removed


def partition(plan: NetworkPlan, serial: int, kind: PartitionFrom) -> None:
    """Cut VM ``serial`` off from ``kind`` (replacing any partition it had)."""
    heal(plan, serial)
    ip, namespace = _ip(), plan.namespace(serial)
    for route in plan.partition_routes(kind):
        _run([ip, "-n", namespace, "route", "replace", *route.args()])


def heal(plan: NetworkPlan, serial: int) -> bool:
    """Remove every partition route and the qdisc of VM ``serial``; whether there was anything to remove."""
    ip, namespace = _ip(), plan.namespace(serial)
    found = False
    for destination in plan.healing_routes():
        found |= _run([ip, "-n", namespace, "route", "del", destination], check=False).returncode == 0
    found |= _run(["tc", "-n", namespace, "qdisc", "del", "dev", NODE_INTERFACE, "root"], check=False).returncode == 0
    return found


def shape(plan: NetworkPlan, serial: int, delay_ms: float | None, loss_pct: float | None, rate: float | None) -> str:
    """Slow VM ``serial``'s outgoing traffic (netem; tbf for a rate alone); returns what was done.

    Raises a UserInputError naming ``sch_netem`` where the kernel has no netem and netem is needed."""
    if shutil.which("tc") is None:
        raise UserInputError("netem needs the `tc` command (iproute2), which is not on PATH: install iproute2")
    namespace = plan.namespace(serial)
    if delay_ms is None and loss_pct is None and rate is not None:
        qdisc, how = tbf_args(rate), f"rate {rate:g} Mbit/s (tbf: netem is not needed for a rate alone)"
    else:
        qdisc = netem_args(delay_ms or 0.0, loss_pct or 0.0, rate)
        how = "netem " + " ".join(qdisc[1:])
    out = _run(["tc", "-n", namespace, "qdisc", "replace", "dev", NODE_INTERFACE, "root", *qdisc], check=False)
    if out.returncode != 0:
        if qdisc[0] == "netem" and "unknown" in out.stderr.lower():
            raise UserInputError(NETEM_MISSING)
        raise NetworkError(f"tc qdisc replace ... {' '.join(qdisc)} failed: {out.stderr.strip()}")
    return how
