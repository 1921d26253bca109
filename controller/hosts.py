"""Whether a host is this machine only: one answer for every check that allows plain HTTP, or anything else,
on loopback alone (the controller's listen addresses, a cloud API's local fake)."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost``, or a loopback IP address (127.0.0.0/8, ::1; an IPv6 zone such as ``%lo`` ignored)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
