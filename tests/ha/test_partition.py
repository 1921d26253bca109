"""A leader partitioned from its database, on network namespaces: it steps down before its lease can end, the
standby takes over at the next epoch, and once the partition heals the old leader stays a standby naming the new.

The topology is the test's own (names begin ``smha`` and a few random hex digits): a bridge in the root
namespace with the test's address (.1) and the database's (.2, a PostgreSQL server of its own listening there),
and two namespaces on it, each with a veth and a controller (A at .11, B at .12). The partition cuts A off from
the database only: in A's namespace the database's address resolves to a MAC address nobody has, so what A
sends it is lost without a word (no error, no reset, as behind a firewall's DROP; this needs neither iptables
nor tc's drop action, which machines here may lack), while A still answers the test and B. Healing deletes
that neighbour entry.

Three cases: an idle leader; a transaction of A's left open on the server by the partition (its row lock on
the lease must not keep the standby out: the server ends the session); and a leader writing when cut off
(expected to fail: the runner writes on the event loop, which the deadline to step down needs).
"""

from __future__ import annotations

import ipaddress
import random
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import grpc
import pytest

from controller.persistence import leases
from controller.persistence.store import Store
from protos.reasons import leader_of, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.local import netns
from tests.controller.helpers import REPO
from tests.ha.daemons import LEASE_SECONDS, Daemon, logs, refused, start, submit, until
from tests.postgres import MISSING, PostgresServer, find_binaries

REASON = netns.unavailable_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces cannot be made here: {REASON}"),
]
SUBNETS = ipaddress.IPv4Network("10.79.0.0/16")  # clear of 10.77.0.0/16, where `local up --netns` takes its /24s
NOWHERE = "02:00:5e:00:de:ad"  # a MAC address no interface has: frames to it are lost on the bridge
PERMANENT = ["nud", "permanent", "dev", "eth0"]
# "2026-11-29 00:59:25,546 WARNING spotmorph.controller controller 10.79.3.11:4567: LEADING -> STANDBY (...)"
ROLE_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ controller (?P<address>\S+): "
    r"(?P<source>\w+) -> (?P<target>\w+) \((?P<cause>\w+), epoch (?P<epoch>\d+)\)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Topology:
    prefix: str  # every namespace and link made begins "<prefix>-"
    subnet: ipaddress.IPv4Network

    def host(self, number: int) -> str:
        return str(self.subnet.network_address + number)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def gateway(self) -> str:  # the root namespace's own address: the test's calls come from it
        return self.host(1)

    @property
    def database(self) -> str:
        return self.host(2)

    def namespace(self, serial: int) -> str:
        return f"{self.prefix}-n{serial}"

    def veth(self, serial: int) -> str:
        return f"{self.prefix}-v{serial}"

    def address(self, serial: int) -> str:
        return self.host(10 + serial)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")
    return out


def make(topology: Topology, serials: list[int]) -> None:
    """The bridge with the test's and the database's addresses, and one namespace on it per serial."""
    length = topology.subnet.prefixlen
    ip("link", "add", topology.bridge, "type", "bridge")
    for address in (topology.gateway, topology.database):  # .1 first: the primary, the test's source address
        ip("addr", "add", f"{address}/{length}", "dev", topology.bridge)
    ip("link", "set", topology.bridge, "up")
    for serial in serials:
        namespace, veth = topology.namespace(serial), topology.veth(serial)
        ip("netns", "add", namespace)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", veth, "master", topology.bridge, "up")
        ip("-n", namespace, "addr", "add", f"{topology.address(serial)}/{length}", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")


def remove(topology: Topology) -> None:
    """Delete every namespace and link bearing the prefix; wait until none is left."""
    for namespace in netns.leftovers(topology.prefix)[0]:
        ip("netns", "del", namespace, check=False)
    deadline = time.monotonic() + 10
    while any(left := netns.leftovers(topology.prefix)):  # a veth goes with its namespace, a little after it
        assert time.monotonic() < deadline, f"left behind: {left[0] + left[1]}"
        for link in left[1]:
            ip("link", "del", link, check=False)
        time.sleep(0.1)


@pytest.fixture
def topology() -> Iterator[Topology]:
    topology = Topology(f"smha{secrets.token_hex(2)}", SUBNETS)
    try:
        with netns.allocation_lock():
            taken = [ipaddress.IPv4Network(used, strict=False) for used in netns.used_networks()]
            free = [s for s in SUBNETS.subnets(new_prefix=24) if not any(s.overlaps(t) for t in taken)]
            assert free, f"every /24 of {SUBNETS} is in use on this machine"
            topology = Topology(topology.prefix, random.choice(free))
            make(topology, [1, 2])
        yield topology
    finally:
        remove(topology)
        assert netns.leftovers(topology.prefix) == ([], []), "a namespace or link of the test is left"


@pytest.fixture
def database(topology: Topology) -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, listening on the bridge (the session's listens on loopback)."""
    binaries = find_binaries()
    if binaries is None:
        pytest.skip(MISSING)
    with PostgresServer.start(binaries, listen_addresses=[topology.database]) as server:
        yield server


@dataclass(frozen=True)
class RoleLine:
    at: float  # Unix seconds, this host's clock (the log's local time, to the millisecond, rounded down)
    address: str
    source: str
    target: str
    cause: str
    epoch: int


def roles(daemon: Daemon) -> list[RoleLine]:
    found = []
    for m in ROLE_LINE.finditer(daemon.log.read_text()):
        at = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found.append(RoleLine(at, m["address"], m["source"], m["target"], m["cause"], int(m["epoch"])))
    return found


def change(daemon: Daemon, target: str, cause: str) -> RoleLine | None:
    return next((r for r in roles(daemon) if r.target == target and r.cause == cause), None)


@dataclass(frozen=True)
class Handover:
    partitioned: float  # when the partition began (this host's clock, as the log lines')
    expires: float  # the last expiry of epoch 1's lease the database held (its clock: this host's)
    stepped: RoleLine  # A: LEADING -> STANDBY
    taken: RoleLine  # B: STANDBY -> LEADING

    def show(self, what: str) -> None:
        print(
            f"\n{what}: partition -> A steps down {self.stepped.at - self.partitioned:.2f} s, -> B leads "
            f"{self.taken.at - self.partitioned:.2f} s (lease {LEASE_SECONDS} s; epoch 1's lease could run until "
            f"{self.expires - self.partitioned:.2f} s)"
        )


@dataclass(frozen=True)
class Pair:
    topology: Topology
    first: Daemon  # A, in namespace 1: leads at epoch 1
    second: Daemon  # B, in namespace 2: stands by
    store: Store  # in the root namespace, which no partition touches

    def partition(self) -> float:
        """Cut A off from the database (only); returns when."""
        at = time.time()
        ip("-n", self.topology.namespace(1), "neigh", "replace", self.topology.database, "lladdr", NOWHERE, *PERMANENT)
        return at

    def heal(self) -> None:
        ip("-n", self.topology.namespace(1), "neigh", "del", self.topology.database, "dev", "eth0")

    def handover(self, partitioned: float) -> Handover:
        """Watch the lease row until B holds it, then read both role changes from the logs."""
        first, second = self.first, self.second
        expires = 0.0
        deadline = time.monotonic() + 30
        while (lease := leases.current(self.store.engine)) is not None and lease.epoch == 1:
            expires = max(expires, lease.expires_at)
            assert time.monotonic() < deadline, f"no takeover 30 s into the partition\n{logs(first, second)}"
            time.sleep(0.02)
        assert lease is not None and (lease.epoch, lease.address) == (2, second.address), lease
        assert expires > partitioned, "epoch 1's lease was never seen live during the partition"
        taken = _waited(lambda: change(second, "LEADING", "lease_taken"), first, second)
        stepped = _waited(lambda: change(first, "STANDBY", "renewal_overdue"), first, second)
        assert (stepped.source, stepped.epoch, taken.source, taken.epoch) == ("LEADING", 1, "STANDBY", 2)
        assert "the lease's renewal is overdue" in first.log.read_text()
        return Handover(partitioned, expires, stepped, taken)


@pytest.fixture
def pair(tmp_path: Path, topology: Topology, database: PostgresServer, daemons: list[Daemon]) -> Iterator[Pair]:
    url = database.create_database("partition")
    first = start(tmp_path, "a", url, daemons, topology.address(1), netns.exec_prefix(topology.namespace(1)))
    second = start(tmp_path, "b", url, daemons, topology.address(2), netns.exec_prefix(topology.namespace(2)))
    store = Store(url)
    try:
        lease = leases.current(store.engine)
        assert lease is not None and (lease.epoch, lease.address) == (1, first.address), lease
        _waited(lambda: change(second, "STANDBY", "lease_held_elsewhere"), second)
        yield Pair(topology, first, second, store)
    finally:
        store.close()


def assert_stepped_down_in_time(handover: Handover) -> None:
    # A log line's time is rounded down to the millisecond: A's change came at most 1 ms after it.
    assert handover.stepped.at + 0.001 < handover.expires, "A was still leading when its lease could have ended"
    assert handover.stepped.at + 0.001 < handover.taken.at, "A was still leading when B took over"


# In `make soak`: make test keeps the leader cut off while writing (below), the harder case of the same deadline.
@pytest.mark.soak
def test_a_leader_cut_off_from_the_database_steps_down_before_its_lease_ends(pair: Pair, tmp_path: Path) -> None:
    first, second = pair.first, pair.second
    handover = pair.handover(pair.partition())
    handover.show("an idle leader")
    assert_stepped_down_in_time(handover)

    pair.heal()
    named = lambda: leader_of(refused(first, tmp_path).trailing_metadata()) == second.address  # noqa: E731
    until(named, "once healed, A refuses writes naming B", first, second)
    refusal = refused(first, tmp_path)
    assert refusal.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(refusal.trailing_metadata()) == "not-leader"
    job = submit(second, tmp_path)
    assert isinstance(job, str), job
    lease = leases.current(pair.store.engine)
    assert lease is not None and (lease.epoch, lease.address) == (2, second.address), lease
    assert [(r.target, r.cause) for r in roles(first)] == [("LEADING", "lease_taken"), ("STANDBY", "renewal_overdue")]
    listed = lambda: [j.id for j in first.jobs().ListJobs(pb.ListJobsRequest(), timeout=10).jobs] == [job]  # noqa: E731
    until(listed, "A, standing by, answers reads with what B wrote", first, second)


# A transaction of A's left open by the partition: the fence every write of the leader begins with, a row lock on
# the lease (FOR SHARE), then silence, as when the partition cuts A off between a write's statements.
IN_FLIGHT = """
import sys, time
from controller.persistence import leases
from controller.persistence.store import Store

store = Store(sys.argv[1])
with store.engine.begin() as conn:
    leases.fence(conn, leases.read(conn))
    print("fenced", flush=True)
    time.sleep(300)
"""


# In `make soak` (it waits out the server's 15 s idle-in-transaction limit): make test keeps the leader cut off while
# writing, below.
@pytest.mark.soak
def test_a_transaction_cut_off_does_not_hold_the_lease_from_the_standby(pair: Pair) -> None:
    """The server ends a session left idle in a transaction (controller.persistence.dialect's session options),
    releasing its lock on the lease row, which the standby's take waits for; without that it would wait for the
    server's keepalives to give up on A (hours)."""
    command = [*netns.exec_prefix(pair.topology.namespace(1)), sys.executable, "-c", IN_FLIGHT, pair.store.target]
    writer = subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "fenced"
        handover = pair.handover(pair.partition())
        handover.show("a leader's transaction left open")
        assert_stepped_down_in_time(handover)
    finally:
        writer.kill()
        writer.wait(10)


def test_a_leader_cut_off_while_writing_steps_down_before_its_lease_ends(pair: Pair, tmp_path: Path) -> None:
    first = pair.first
    partitioned = pair.partition()
    with ThreadPoolExecutor(1) as pool:  # A's reply waits on the database it cannot reach
        writing = pool.submit(submit, first, tmp_path)
        handover = pair.handover(partitioned)
        handover.show("a leader writing")
        assert isinstance(writing.result(60), grpc.RpcError), "A took a write it could not have stored"
    assert_stepped_down_in_time(handover)


def _waited(find: Callable[[], RoleLine | None], *daemons: Daemon, seconds: float = 10.0) -> RoleLine:
    """The role line ``find`` returns, once the log holds it."""
    deadline = time.monotonic() + seconds
    while (line := find()) is None:
        assert time.monotonic() < deadline, f"no such role line within {seconds} s\n{logs(*daemons)}"
        time.sleep(0.05)
    return line
