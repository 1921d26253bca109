"""Offline Azure: no test here may open a socket beyond loopback."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # AF_UNIX
    host = str(address[0])
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(self: socket.socket, address: Any) -> None:
        if not _loopback(address):
            raise AssertionError(f"a test tried to reach {address} (beyond loopback)")
        connect(self, address)

    def guarded_ex(self: socket.socket, address: Any) -> int:
        if not _loopback(address):
            raise AssertionError(f"a test tried to reach {address} (beyond loopback)")
        return connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)
    yield
