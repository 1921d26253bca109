"""Which network interface trainers bind their collectives to: the one that holds the advertised address.

gloo (and NCCL's socket transport) pick an interface by resolving the host name unless told otherwise;
on a VM whose host name resolves to 127.0.0.1, or in a network namespace, that address is not one the
other nodes reach. The agent advertises ``--address`` to the controller (it becomes the rendezvous
host of the ranks it runs), so its trainers bind to the interface holding that address:
``GLOO_SOCKET_IFNAME=eth0`` and ``NCCL_SOCKET_IFNAME==eth0`` (NCCL's ``=`` asks for that exact name, not
every name starting with it).

The reading of what the node has is pure (:func:`addresses_from_ip_json`, :func:`interface_holding`,
:func:`socket_environment`); :func:`find_interface` collects it (``ip -j addr``, else one ioctl per
interface for IPv4). No torch here: the agent never imports it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterable, Mapping

from worker_agent.contract import GLOO_SOCKET as GLOO
from worker_agent.contract import NCCL_SOCKET as NCCL

SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (first) IPv4 address


def addresses_from_ip_json(text: str) -> list[tuple[str, str]]:
    """``(interface, address)`` for every address in the output of ``ip -j addr`` (nothing when unreadable)."""
    try:
        links = json.loads(text)
    except ValueError:
        return []
    found = []
    for link in links if isinstance(links, list) else []:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        for info in link.get("addr_info") or []:
            if isinstance(info, dict) and isinstance(info.get("local"), str):
                found.append((link["ifname"], info["local"]))
    return found


def interface_holding(address: str, addresses: Iterable[tuple[str, str]]) -> str | None:
    """The interface that holds ``address`` (an IP literal), or None (a name, or an address of no interface)."""
    try:
        wanted = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    for interface, held in addresses:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(held.split("%", 1)[0]) == wanted:
                return interface
    return None


def socket_environment(environ: Mapping[str, str], interface: str | None) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` for ``interface``; a value already set is left alone."""
    if interface is None:
        return {}
    wanted = {GLOO: interface, NCCL: f"={interface}"}
    return {name: value for name, value in wanted.items() if not environ.get(name)}


def find_interface(address: str) -> str | None:
    """The interface of this host (this network namespace) holding ``address``, resolved if it is a name."""
    literal = _literal(address)
    if literal is None:
        return None
    return interface_holding(literal, _addresses())


def _literal(address: str) -> str | None:
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(address.strip("[]")))
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def _addresses() -> list[tuple[str, str]]:
    ip = shutil.which("ip")
    if ip is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, timeout=10, check=False)
            if out.returncode == 0:
                return addresses_from_ip_json(out.stdout)
    return _ipv4_by_ioctl()


def _ipv4_by_ioctl() -> list[tuple[str, str]]:
    """Each interface's first IPv4 address, asked of the kernel (where there is no ``ip`` command)."""
    import fcntl

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
                found.append((name, socket.inet_ntoa(reply[20:24])))
    return found
