"""The controllers an agent knows and which one it calls: pure, so the switching is tested without a server.

Two or more controllers share one database and one of them leads; the others refuse every agent call with
``not-leader`` and name the leader they know (:mod:`protos.reasons`). The agent is given the list
(``--controller a:50051,b:50051``) and calls one address at a time: after a call that did not reach a leader it
moves to the leader the refusal named (even one not in the list), else to the next address in the list, round
robin. Moving is cheap and never a retry by itself: the loop's own cadence (registration backoff, heartbeat
interval) decides when the next call goes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from morphing.errors import UserInputError

# The call did not get to a controller (down, partitioned, too slow): another one may lead. Other retryable
# codes (INTERNAL, RESOURCE_EXHAUSTED, ...) came from a controller that answered; the agent stays with it.
MOVE_ON_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
# gRPC's own target names, taken as they are (one address each): a Unix socket, a DNS name resolved by gRPC.
TARGET_SCHEMES = ("unix:", "unix-abstract:", "dns:")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")
EXAMPLE = "10.0.0.4:50051,10.0.0.5:50051"


@dataclass(frozen=True)
class Controllers:
    """The configured addresses, the one calls go to now, and the configured one last taken in turn."""

    addresses: tuple[str, ...]
    current: str
    position: int = 0  # index in ``addresses`` the round robin goes on from (``current`` may be a named leader)

    @classmethod
    def of(cls, addresses: tuple[str, ...]) -> Controllers:
        if not addresses:
            raise ValueError("no controller address")
        return cls(addresses, addresses[0], 0)


def after_failure(controllers: Controllers, failed: str, leader: str) -> Controllers:
    """Where to call next once ``failed`` did not answer as the leader: the ``leader`` its refusal named (not
    ``failed`` itself), else the next configured address. A failure at an address that is no longer the current
    one changes nothing: a concurrent call has moved on already, and moving again would skip the new one."""
    if failed != controllers.current:
        return controllers
    if leader and leader != failed:
        known = controllers.addresses
        return replace(
            controllers, current=leader, position=known.index(leader) if leader in known else controllers.position
        )
    position = (controllers.position + 1) % len(controllers.addresses)
    return Controllers(controllers.addresses, controllers.addresses[position], position)


def parse_controllers(text: str, source: str = "--controller") -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as addresses, in order, each once; an empty or malformed entry is the
    user's to fix (``source``: where the text came from, named in the error)."""
    found: list[str] = []
    for number, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        problem = _problem(entry)
        if problem:
            raise UserInputError(
                f"{source} {text!r}: entry {number} {problem}; give HOST:PORT, or several separated by commas "
                f"without spaces or empty entries (e.g. {EXAMPLE})"
            )
        if entry not in found:
            found.append(entry)
    return tuple(found)


def _problem(entry: str) -> str:
    """What is wrong with one entry ('' for nothing)."""
    if not entry:
        return "is empty"
    if entry.startswith(TARGET_SCHEMES):
        return "" if entry.split(":", 1)[1].strip("/") else f"({entry!r}) names no target"
    if any(c.isspace() for c in entry):
        return f"({entry!r}) has a space in it"
    host, colon, port = entry.rpartition(":")
    if not colon:
        return f"({entry!r}) has no port: write it HOST:PORT"
    if not host:
        return f"({entry!r}) has no host before its port"
    if not _HOST.match(host):
        hint = " (an IPv6 address goes in brackets: [::1]:50051)" if ":" in host else ""
        return f"({entry!r}) has no usable host {host!r}{hint}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"({entry!r}) has no port number from 1 to 65535 ({port!r})"
    return ""
