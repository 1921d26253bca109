"""The network of a ``--netns`` local cluster, as values: names, addresses, partition routes, qdiscs.

Every "VM" is a Linux network namespace with an ``eth0`` (one end of a veth pair) on a bridge in the
root namespace. In a /24 such as ``10.77.5.0/24``:

- ``.1`` is the bridge's address, where the controller listens;
- ``.254`` is the platform's (the Scheduled Events service): a second address on the bridge, so a node
  cut off from the controller still reads its eviction notices, as an Azure VM reaches IMDS through
  its host whatever its network does;
- ``.(10 + N)`` is VM ``vm-N``'s address (N up to 240).

The bridge's MAC address is set when it is made (:attr:`NetworkPlan.bridge_mac`), never left to follow its
ports, so the controller's address keeps the MAC every namespace resolved it to as VMs come and go.

Names start with the cluster's prefix (``sm`` and 5 hex digits of a hash of the cluster directory,
so one home always has the same prefix and two homes differ): the bridge ``<prefix>-br``, the VM's
namespace ``<prefix>-vm-N`` and the host end of its veth ``<prefix>-vN`` (Linux allows 15 characters).
``down`` removes what the cluster recorded and sweeps whatever else bears the prefix.

A partition is a set of routes in the node's namespace (blackholes; nothing is sent to the far side,
and what the far side sends gets no answer); ``heal`` deletes every route a partition can add and the
node's qdisc. Nothing here runs a command: :mod:`spotmorph.local.netns` does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from morphing.errors import UserInputError
from spotmorph.local.flags import within

SUBNETS = ipaddress.IPv4Network("10.77.0.0/16")  # /24s are taken from here, one per cluster
VM_OFFSET = 10  # vm-N has host number 10 + N
MAX_VMS = 240
PLATFORM_HOST = 254
NODE_INTERFACE = "eth0"  # the VM's end of its veth, inside its namespace
MAX_IFNAME = 15  # IFNAMSIZ - 1


class PartitionFrom(StrEnum):
    """What ``spotmorph local partition NODE --from ...`` cuts the node off from."""

    CONTROLLER = "controller"  # the controller only: peers and the checkpoint share stay reachable
    PEERS = "peers"  # every other VM: the controller stays reachable
    ALL = "all"  # the controller and every other VM


@dataclass(frozen=True)
class Route:
    """One route in a node's namespace: ``ip route replace [blackhole] DEST [dev DEV]``."""

    destination: str
    blackhole: bool

    def args(self) -> list[str]:
        if self.blackhole:
            return ["blackhole", self.destination]
        return [self.destination, "dev", NODE_INTERFACE, "scope", "link"]


def prefix_of(cluster_root: Path) -> str:
    """The cluster's name prefix: ``sm`` and 5 hex digits of its directory's path."""
    digest = hashlib.sha256(str(Path(cluster_root).resolve()).encode()).hexdigest()
    return f"sm{digest[:5]}"


@dataclass(frozen=True)
class NetworkPlan:
    """The names and addresses of one cluster's network (``network.json`` in its directory)."""

    prefix: str
    subnet: str  # e.g. 10.77.5.0/24

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    def host(self, number: int) -> str:
        return str(self.network.network_address + number)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC address, set when it is made: locally administered, unicast, from the subnet.

        A bridge left to choose takes the lowest MAC among its ports and changes it as VMs join; frames to the
        old one were dropped, so a namespace that had cached it lost the controller until its ARP entry
        expired (seen: a node declared lost for 25 s right after a VM was added). A MAC that is set stays."""
        a, b, c, d = self.network.network_address.packed
        return f"02:73:6d:{b:02x}:{c:02x}:{(a ^ d):02x}"

    @property
    def controller_address(self) -> str:
        return self.host(1)

    @property
    def platform_address(self) -> str:
        return self.host(PLATFORM_HOST)

    def check_serial(self, serial: int) -> None:
        if not 1 <= serial <= MAX_VMS:
            raise UserInputError(f"vm-{serial}: a --netns cluster holds vm-1 .. vm-{MAX_VMS}")

    def namespace(self, serial: int) -> str:
        return f"{self.prefix}-vm-{serial}"

    def veth(self, serial: int) -> str:
        """The host end of the VM's veth pair (its other end is ``eth0`` in the namespace)."""
        return f"{self.prefix}-v{serial}"

    def vm_address(self, serial: int) -> str:
        self.check_serial(serial)
        return self.host(VM_OFFSET + serial)

    def partition_routes(self, kind: PartitionFrom) -> list[Route]:
        """The routes that cut a node off from ``kind`` (the platform stays reachable in every kind)."""
        halves = [str(n) for n in self.network.subnets(prefixlen_diff=1)]
        controller = f"{self.controller_address}/32"
        platform = Route(f"{self.platform_address}/32", blackhole=False)
        if kind is PartitionFrom.CONTROLLER:
            return [Route(controller, blackhole=True)]
        peers = [Route(half, blackhole=True) for half in halves]
        to_controller = Route(controller, blackhole=kind is PartitionFrom.ALL)
        return [*peers, to_controller, platform]

    def healing_routes(self) -> list[str]:
        """Every destination a partition may have routed (heal deletes each, whichever partition it was)."""
        destinations = {r.destination for kind in PartitionFrom for r in self.partition_routes(kind)}
        return sorted(destinations)

    def owns(self, name: str) -> bool:
        """Whether a namespace or link of this name is the cluster's (it bears the prefix)."""
        return name.startswith(f"{self.prefix}-")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NetworkPlan:
        data = json.loads(text)
        return cls(str(data["prefix"]), str(data["subnet"]))


def choose_subnet(prefix: str, used: list[str], requested: str | None = None) -> str:
    """A /24 of 10.77.0.0/16 that no address or route of this machine is in (``requested`` if given and free).

    The search starts at a place given by the prefix, so two clusters rarely even try the same one."""
    taken = [ipaddress.IPv4Network(u, strict=False) for u in used if _is_ipv4_network(u)]
    if requested is not None:
        try:
            subnet = ipaddress.IPv4Network(requested)
        except ValueError as exc:
            raise UserInputError(f"--subnet {requested}: {exc}; give a /24 such as 10.77.5.0/24") from None
        if subnet.prefixlen != 24 or not subnet.is_private:
            raise UserInputError(f"--subnet {requested}: give a private /24 such as 10.77.5.0/24")
        if any(subnet.overlaps(t) for t in taken if t.prefixlen > 0):
            raise UserInputError(f"--subnet {requested}: this machine already uses it; choose another /24")
        return str(subnet)
    candidates = list(SUBNETS.subnets(new_prefix=24))[1:-1]
    start = int(prefix[2:], 16) % len(candidates)
    for candidate in candidates[start:] + candidates[:start]:
        if not any(candidate.overlaps(t) for t in taken if t.prefixlen > 0):
            return str(candidate)
    raise UserInputError("every /24 of 10.77.0.0/16 is in use on this machine; run `spotmorph local down` elsewhere")


def _is_ipv4_network(text: str) -> bool:
    try:
        return ipaddress.ip_network(text, strict=False).version == 4
    except ValueError:
        return False


def netem_args(delay_ms: float, loss_pct: float, rate_mbit: float | None) -> list[str]:
    """The ``netem`` qdisc for a delay, a loss and a rate (the arguments after ``root``)."""
    args = ["netem", "delay", f"{delay_ms:g}ms"]
    if loss_pct > 0:
        args += ["loss", f"{loss_pct:g}%"]
    if rate_mbit is not None:
        args += ["rate", f"{rate_mbit:g}mbit"]
    return args


def tbf_args(rate_mbit: float) -> list[str]:
    """A token bucket for ``rate_mbit`` alone (what works where netem does not): a burst of 1/100 s of traffic."""
    burst_bytes = max(1600, int(rate_mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst_bytes), "latency", "400ms"]


def check_shaping(delay_ms: float | None, loss_pct: float | None, rate_mbit: float | None) -> None:
    """A netem request names something to do, within range.

    The smallest values are what ``tc`` resolves (a microsecond, a kbit/s); they also keep ``:g`` from
    writing an exponent (``1e-05ms``), which ``tc`` does not parse.
    """
    if delay_ms is None and loss_pct is None and rate_mbit is None:
        raise UserInputError("netem: give at least one of --delay MS, --loss PCT, --rate MBIT")
    if delay_ms is not None:
        within("--delay", delay_ms, 0.001, 60_000, "milliseconds", zero=True)
    if loss_pct is not None:
        within("--loss", loss_pct, 0.0001, 100, "a percentage", zero=True)
    if rate_mbit is not None:
        within("--rate", rate_mbit, 0.001, 100_000, "Mbit/s")
