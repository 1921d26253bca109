"""``spotmorph local up --netns``: every VM a network namespace, and the network faults on it.

These need root (network namespaces, veth pairs, a bridge) and skip with the reason where they cannot
run. Every test ends with ``down`` and checks that no namespace or link of its cluster is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spotmorph.local import netns
from spotmorph.local.cli_calls import spotmorph
from spotmorph.local.harness import LocalCluster
from spotmorph.local.layout import ClusterDir
from spotmorph.local.network import NODE_INTERFACE, prefix_of
from spotmorph.local.processes import alive

from .conftest import invariant_violations
from .netns_helpers import assert_nothing_left, listener, needs_netns, plan_of, reaches

pytestmark = [pytest.mark.slow, needs_netns]
PEER_PORT = 47001
# The checks that leave a cluster as they found it (or last, as the expiry's) share one namespaced cluster of two VMs,
# in this order, on one xdist worker: each namespaced cluster's start and `down` took 5-7 s of a loaded 2-core run.
SHARED = pytest.mark.xdist_group("netns-shared-cluster")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of two namespaced VMs (``--netns``, no warm trainers, the harness's 5 s heartbeat expiry) for the
    checks marked ``SHARED``: at its end, as every cluster fixture does, no decision broke an invariant and ``down``
    left no namespace or link behind."""
    local = LocalCluster(tmp_path_factory.mktemp("netns-shared") / "home")
    violated: list[str] = []
    try:
        local.up(nodes=2, slots=1, netns=True, warm_trainers=0)
        yield local
    finally:
        violated = invariant_violations(local.files)
        if violated:
            print(local.failure_report())
        local.down()
        assert_nothing_left(local.files.root)
    assert not violated, "the controller's decisions broke invariants (InvariantViolated):\n" + "\n".join(violated)


def controller_port(cluster: LocalCluster) -> int:
    return int(cluster.context().controller.rsplit(":", 1)[1])


def platform_port(cluster: LocalCluster) -> int:
    return int(cluster.context().imds_url.rsplit(":", 1)[1])


@SHARED
def test_each_vm_is_a_namespace_with_its_own_address(shared: LocalCluster) -> None:
    cluster = shared  # first on the shared cluster: its two VMs, then a third added
    plan = plan_of(cluster)
    context = cluster.context()
    assert context.controller.startswith(f"{plan.controller_address}:")
    assert context.imds_url.startswith(f"http://{plan.platform_address}:")
    # node names are given in registration order, which two agents starting at once may race for
    assert sorted(n["address"] for n in cluster.nodes()) == sorted([plan.vm_address(1), plan.vm_address(2)])
    assert {vm.node_name: plan.vm_address(vm.serial) for vm in cluster.vms()} == {
        n["name"]: n["address"] for n in cluster.nodes()
    }
    namespaces, links = netns.leftovers(plan.prefix)
    assert sorted(namespaces) == [plan.namespace(1), plan.namespace(2)]
    assert {plan.bridge, plan.veth(1), plan.veth(2)} <= set(links)
    assert all(len(name) <= 15 for name in links)
    # each agent runs inside its VM's namespace (the same network namespace as `ip netns exec` gives)
    for vm in cluster.vms():
        assert vm.pid is not None
        ours = os.readlink(f"/proc/{vm.pid}/ns/net")
        assert ours != os.readlink("/proc/self/ns/net")
        assert os.stat(f"/run/netns/{plan.namespace(vm.serial)}").st_ino == os.stat(f"/proc/{vm.pid}/ns/net").st_ino
    bridge_mac = Path(f"/sys/class/net/{plan.bridge}/address")
    assert bridge_mac.read_text().strip() == plan.bridge_mac
    # `local add` gives the new VM a namespace too
    cluster.add(1)
    cluster.wait(lambda: len(cluster.nodes()) == 3, 60, "node-3 to register")
    added = {n["name"]: n["address"] for n in cluster.nodes()}["node-3"]
    assert added == plan.vm_address(3)
    # a bridge left to itself takes its lowest port MAC, so a VM joining could move the controller's MAC
    assert bridge_mac.read_text().strip() == plan.bridge_mac, "the bridge's MAC stays as VMs join"


# make test: "all"; make soak: each direction alone
@pytest.mark.parametrize(
    "kind", [pytest.param("controller", marks=pytest.mark.soak), pytest.param("peers", marks=pytest.mark.soak), "all"]
)
@SHARED
def test_a_partition_blocks_exactly_what_it_says_and_heal_restores(shared: LocalCluster, kind: str) -> None:
    cluster = shared  # healed at the end, as it found it
    plan = plan_of(cluster)
    # node names follow registration order, which the two agents race for: find node-1's VM
    mine = cluster.vm_of("node-1").serial
    theirs = 3 - mine
    me, peer = plan.namespace(mine), plan.namespace(theirs)
    control, platform = (
        (plan.controller_address, controller_port(cluster)),
        (plan.platform_address, platform_port(cluster)),
    )
    with listener(me, plan.vm_address(mine), PEER_PORT), listener(peer, plan.vm_address(theirs), PEER_PORT):
        probes: dict[str, tuple[str, str, int]] = {
            "controller": (me, *control),
            "to peer": (me, plan.vm_address(theirs), PEER_PORT),
            "from peer": (peer, plan.vm_address(mine), PEER_PORT),
            "platform": (me, *platform),
            "peer to controller": (peer, *control),
        }

        def links() -> dict[str, bool]:
            """Every probe at once: a cut link's waits out its 2 s connect timeout beside the others'."""
            with ThreadPoolExecutor(len(probes)) as pool:
                found = {name: pool.submit(reaches, *probe) for name, probe in probes.items()}
                return {name: future.result() for name, future in found.items()}

        assert all(links().values())
        out = cluster.cli("local", "partition", "node-1", "--from", kind)
        assert f"partitioned from {kind}" in out.stdout
        cut_controller, cut_peers = kind in {"controller", "all"}, kind in {"peers", "all"}
        assert links() == {
            "controller": not cut_controller,
            "to peer": not cut_peers,
            "from peer": not cut_peers,
            "platform": True,  # eviction notices still arrive, as IMDS does on Azure
            "peer to controller": True,
        }
        assert "healed" in cluster.cli("local", "heal", "node-1").stdout
        assert all(links().values())
        assert "no partition" in cluster.cli("local", "heal", "node-1").stdout


@pytest.mark.soak  # make soak; make test: faults on namespaces through the partitions below
def test_netem_names_the_missing_module_or_shapes_the_link(cluster: LocalCluster) -> None:
    cluster.up(nodes=1, slots=1, netns=True, warm_trainers=0)
    namespace = plan_of(cluster).namespace(1)

    def qdisc() -> str:
        return subprocess.run(
            ["tc", "-n", namespace, "qdisc", "show", "dev", NODE_INTERFACE], capture_output=True, text=True, check=True
        ).stdout

    delayed = cluster.cli("local", "netem", "node-1", "--delay", "40", "--loss", "1", check=False)
    if delayed.returncode == 2:
        assert "sch_netem" in delayed.stderr and "--rate alone" in delayed.stderr, delayed.stderr
        assert "netem" not in qdisc()
    else:
        assert delayed.returncode == 0, delayed.stderr
        assert "delay 40ms" in qdisc() and "loss 1%" in qdisc()
    rated = cluster.cli("local", "netem", "node-1", "--rate", "20")
    assert "tbf" in rated.stdout and "rate 20Mbit" in qdisc()
    nothing = cluster.cli("local", "netem", "node-1", check=False)
    assert nothing.returncode == 2 and "--delay" in nothing.stderr
    cluster.cli("local", "heal", "node-1")
    assert "tbf" not in qdisc() and "netem" not in qdisc()


@SHARED
def test_netem_delay_where_the_kernel_has_sch_netem(shared: LocalCluster) -> None:
    cluster = shared
    namespace = plan_of(cluster).namespace(cluster.vm_of("node-1").serial)
    out = cluster.cli("local", "netem", "node-1", "--delay", "25", "--loss", "2", "--rate", "50", check=False)
    if out.returncode == 2 and "sch_netem" in out.stderr:
        pytest.skip("this kernel has no sch_netem module (tc netem); the test above checks the message")
    try:
        assert out.returncode == 0, out.stderr
        shown = subprocess.run(
            ["tc", "-n", namespace, "qdisc", "show", "dev", NODE_INTERFACE], capture_output=True, text=True, check=True
        ).stdout
        assert "netem" in shown and "delay 25ms" in shown and "loss 2%" in shown and "rate 50Mbit" in shown
    finally:
        cluster.cli("local", "heal", "node-1")  # as it found the shared cluster


@SHARED
def test_partitioned_from_the_controller_past_the_expiry_makes_the_node_lost(shared: LocalCluster) -> None:
    cluster = shared  # last on the shared cluster: node-1 comes back from LOST quarantined
    cluster.cli("local", "partition", "node-1", "--from", "controller")
    cluster.wait(lambda: cluster.node_state("node-1") == "LOST", 30, "node-1 to be LOST")
    assert cluster.node_state("node-2") == "READY"
    assert cluster.vm_of("node-1").alive(), "a partition is not a crash: the VM's agent still runs"
    events = [e for e in cluster.events() if e.get("subject") == "node-1" or "node-1" in str(e)]
    assert any("heartbeat" in str(e) for e in events), events
    cluster.cli("local", "heal", "node-1")


def test_faults_on_a_loopback_cluster_say_to_use_netns(cluster: LocalCluster) -> None:
    cluster.up(nodes=1, slots=1, warm_trainers=0)
    out = cluster.cli("local", "partition", "node-1", check=False)
    assert out.returncode == 2 and "local up --netns" in out.stderr


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


@pytest.mark.soak  # make soak; make test: every namespaced cluster's fixture checks down leaves nothing
def test_down_after_up_was_killed_leaves_nothing(tmp_path: Path, cluster: LocalCluster) -> None:
    """SIGKILL the whole `local up` process tree midway (namespaces made, maybe no context yet), then `down`."""
    root = ClusterDir.of_home(cluster.home).root
    prefix = prefix_of(root)
    up = subprocess.Popen(
        spotmorph("local", "up", "--netns", "--nodes", "3", "--slots", "1"),
        env=cluster.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed: list[int] = []
    try:
        cluster.wait(lambda: len(netns.leftovers(prefix)[0]) >= 2, 60, "`local up` to make namespaces")
        killed = descendants(up.pid)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):  # a short-lived child (`ip`) may be gone already
                os.kill(pid, signal.SIGKILL)
    finally:
        up.kill()
        up.wait()
    assert any(netns.leftovers(prefix)), "the crash should have left namespaces and links behind"
    first = cluster.down()
    assert first.returncode == 0, first.stderr
    assert "removed" in first.stdout
    assert_nothing_left(root)
    cluster.wait(lambda: not any(alive(pid) for pid in killed), 30, "every process of the cluster to end")
    second = cluster.down()
    assert second.returncode == 2 and "no local cluster" in second.stderr
    assert_nothing_left(root)


def test_without_the_rights_up_netns_exits_2_saying_what_is_missing(cluster: LocalCluster) -> None:
    """Root without CAP_NET_ADMIN and CAP_SYS_ADMIN (as a non-root user would be), then without `ip`."""
    args = spotmorph("local", "up", "--netns", "--nodes", "1")
    dropped = subprocess.run(
        ["setpriv", "--bounding-set=-net_admin,-sys_admin", *args], env=cluster.env, capture_output=True, text=True
    )
    assert dropped.returncode == 2, dropped.stderr
    assert "CAP_NET_ADMIN and CAP_SYS_ADMIN" in dropped.stderr and "root" in dropped.stderr
    no_ip = subprocess.run(args, env={**cluster.env, "PATH": "/nonexistent"}, capture_output=True, text=True)
    assert no_ip.returncode == 2 and "`ip` command (iproute2)" in no_ip.stderr
    assert not cluster.files.root.exists(), "nothing is made before the rights are checked"
