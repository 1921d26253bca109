"""Trainers bind gloo and NCCL to the interface holding the agent's advertised address."""

from __future__ import annotations

import json

from worker_agent.agent.gpus import Gpu, trainer_environment
from worker_agent.agent.interfaces import (
    addresses_from_ip_json,
    find_interface,
    interface_holding,
    socket_environment,
)

# `ip -j addr show` inside a --netns VM (trimmed): loopback and eth0 with IPv4 and a link-local IPv6.
IP_JSON = json.dumps(
    [
        {"ifindex": 1, "ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {
            "ifindex": 2,
            "ifname": "eth0",
            "addr_info": [
                {"family": "inet", "local": "10.77.5.11", "prefixlen": 24},
                {"family": "inet6", "local": "fe80::b8e9:1eff:fe92:6e69", "prefixlen": 64},
            ],
        },
        {"ifindex": 3, "ifname": "eth1"},
    ]
)


def test_the_interface_of_an_address_from_ip_json() -> None:
    found = addresses_from_ip_json(IP_JSON)
    assert ("eth0", "10.77.5.11") in found and ("lo", "127.0.0.1") in found
    assert interface_holding("10.77.5.11", found) == "eth0"
    assert interface_holding("fe80::b8e9:1eff:fe92:6e69", found) == "eth0"
    assert interface_holding("[fe80::b8e9:1eff:fe92:6e69]", found) == "eth0"
    assert interface_holding("10.77.5.12", found) is None  # a peer's address: no interface here holds it
    assert interface_holding("node-1.example", found) is None
    assert addresses_from_ip_json("not json") == [] and addresses_from_ip_json('{"a": 1}') == []


def test_gloo_and_nccl_get_the_interface_unless_the_environment_chose() -> None:
    assert socket_environment({}, "eth0") == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}
    assert socket_environment({"GLOO_SOCKET_IFNAME": "ib0"}, "eth0") == {"NCCL_SOCKET_IFNAME": "=eth0"}
    assert socket_environment({}, None) == {}
    env = {"PATH": "/bin"}
    assert trainer_environment(env, (), "eth0") == {**env, "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}
    on_gpu = trainer_environment(env, (Gpu(0, "H100", 80 << 30),), "eth0")
    assert on_gpu is not None and on_gpu["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and on_gpu["GLOO_SOCKET_IFNAME"] == "eth0"


def test_this_host_holds_loopback_on_lo() -> None:
    assert find_interface("127.0.0.1") == "lo"
    assert find_interface("localhost") == "lo"
    assert find_interface("192.0.2.250") is None  # TEST-NET-1: no interface of a test host holds it
