"""A ``--netns`` cluster's network as values: names, addresses, subnets, partition routes, qdiscs."""

from __future__ import annotations

from pathlib import Path

import pytest

from morphing.errors import UserInputError
from spotmorph.local.network import (
    MAX_IFNAME,
    MAX_VMS,
    NetworkPlan,
    PartitionFrom,
    Route,
    check_shaping,
    choose_subnet,
    netem_args,
    prefix_of,
    tbf_args,
)

PLAN = NetworkPlan("sm1a2b3", "10.77.5.0/24")


def test_names_fit_linux_and_bear_the_cluster_prefix() -> None:
    names = [PLAN.bridge, PLAN.veth(MAX_VMS), PLAN.namespace(MAX_VMS)]
    assert all(PLAN.owns(n) for n in names)
    assert len(PLAN.bridge) <= MAX_IFNAME and len(PLAN.veth(MAX_VMS)) <= MAX_IFNAME
    assert not PLAN.owns("sm1a2b4-br") and not PLAN.owns("eth0")


def test_addresses_controller_platform_and_vms() -> None:
    assert (PLAN.controller_address, PLAN.platform_address) == ("10.77.5.1", "10.77.5.254")
    assert [PLAN.vm_address(n) for n in (1, 2, MAX_VMS)] == ["10.77.5.11", "10.77.5.12", "10.77.5.250"]
    with pytest.raises(UserInputError, match=r"vm-1 \.\. vm-240"):
        PLAN.vm_address(MAX_VMS + 1)
    assert NetworkPlan.from_json(PLAN.to_json()) == PLAN


def test_the_bridge_mac_is_set_unicast_locally_administered_and_differs_between_clusters() -> None:
    macs = {NetworkPlan("sm00000", f"10.77.{n}.0/24").bridge_mac for n in range(256)}
    assert len(macs) == 256
    for mac in macs:
        first = int(mac.split(":")[0], 16)
        assert first & 0x01 == 0 and first & 0x02, mac  # unicast, locally administered


def test_the_prefix_is_stable_per_directory_and_differs_between_directories(tmp_path: Path) -> None:
    assert prefix_of(tmp_path / "a") == prefix_of(tmp_path / "a")
    assert prefix_of(tmp_path / "a") != prefix_of(tmp_path / "b")
    assert len(prefix_of(tmp_path)) == 7


def test_partition_routes_cut_exactly_their_kind_and_keep_the_platform() -> None:
    assert PLAN.partition_routes(PartitionFrom.CONTROLLER) == [Route("10.77.5.1/32", blackhole=True)]
    halves = [Route("10.77.5.0/25", blackhole=True), Route("10.77.5.128/25", blackhole=True)]
    platform = Route("10.77.5.254/32", blackhole=False)
    assert PLAN.partition_routes(PartitionFrom.PEERS) == [*halves, Route("10.77.5.1/32", blackhole=False), platform]
    assert PLAN.partition_routes(PartitionFrom.ALL) == [*halves, Route("10.77.5.1/32", blackhole=True), platform]
    assert PLAN.healing_routes() == ["10.77.5.0/25", "10.77.5.1/32", "10.77.5.128/25", "10.77.5.254/32"]
    assert Route("10.77.5.1/32", blackhole=True).args() == ["blackhole", "10.77.5.1/32"]
    assert Route("10.77.5.1/32", blackhole=False).args() == ["10.77.5.1/32", "dev", "eth0", "scope", "link"]


def test_a_subnet_is_one_nothing_on_the_machine_uses() -> None:
    first = choose_subnet("sm00000", [])
    assert first == "10.77.1.0/24"
    assert choose_subnet("sm00000", ["10.77.1.1/24", "10.77.2.0/24", "192.0.2.2/24"]) == "10.77.3.0/24"
    assert choose_subnet("sm0000a", ["10.77.11.5/32"]) == "10.77.12.0/24"


def test_every_subnet_taken_or_a_bad_request_says_so() -> None:
    with pytest.raises(UserInputError, match="in use"):
        choose_subnet("sm00000", ["10.77.0.0/16"])
    assert choose_subnet("sm00000", [], "10.77.9.0/24") == "10.77.9.0/24"
    with pytest.raises(UserInputError, match="already uses it"):
        choose_subnet("sm00000", ["10.77.9.1/24"], "10.77.9.0/24")
    for bad in ("10.77.9.0/23", "8.8.8.0/24", "nonsense"):
        with pytest.raises(UserInputError, match="--subnet"):
            choose_subnet("sm00000", [], bad)


def test_qdisc_arguments() -> None:
    assert netem_args(40, 0, None) == ["netem", "delay", "40ms"]
    assert netem_args(2.5, 1, 100) == ["netem", "delay", "2.5ms", "loss", "1%", "rate", "100mbit"]
    assert tbf_args(8) == ["tbf", "rate", "8mbit", "burst", "10000", "latency", "400ms"]
    assert tbf_args(0.1)[4] == "1600"  # at least one full frame per burst


@pytest.mark.parametrize(
    ("delay", "loss", "rate", "problem"),
    [
        (None, None, None, "at least one"),
        (-1, None, None, "--delay"),
        (None, 101, None, "--loss"),
        (None, None, 0, "--rate"),
    ],
)
def test_a_shaping_request_out_of_range_names_the_option(
    delay: float | None, loss: float | None, rate: float | None, problem: str
) -> None:
    with pytest.raises(UserInputError, match=problem):
        check_shaping(delay, loss, rate)
    check_shaping(10, None, None)
