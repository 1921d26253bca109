"""The controllers an agent knows and which one it calls: pure, so the switching is tested without a server.

Two or more controllers share one database and one of them leads; the others refuse every agent call with
``not-leader`` and name the leader they know (:mod:`protos.reasons`). The agent is given the list
(``--controller a:50051,b:50051``) and calls one address at a time: after a call that did not reach a leader it
moves to the leader the refusal named (even one not in the list), else to the next address in the list, round
robin. Moving is cheap and never a retry by itself: the loop's own cadence (registration backoff, heartbeat
interval) decides when the next call goes. The list itself is read by :func:`protos.addresses.parse_addresses`,
the parser the CLI uses too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The call did not get to a controller (down, partitioned, too slow): another one may lead. Other retryable
# codes (INTERNAL, RESOURCE_EXHAUSTED, ...) came from a controller that answered; the agent stays with it.
MOVE_ON_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})


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
