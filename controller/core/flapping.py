"""Damping a node whose link flaps: one that comes back soon after it was LOST is quarantined in JOINING before work.

A node LOST (its heartbeats stopped for the expiry) that heals registers again as a new incarnation. If it
gets work at once, a link that drops now and then flips it between LOST and ASSIGNED, and every flip
costs its job a morph. So a node whose previous incarnation was LOST within ``flap_memory_seconds`` is
quarantined in JOINING for ``rejoin_quarantine_seconds``, doubled for every further flap in that memory, up to
``rejoin_quarantine_max_seconds``, and it must keep beating all that time (silent, it is GONE as any JOINING
node, and the incarnation after one that ended within its quarantine is quarantined again, longer: that is a
further flap). The quarantine is recorded as a ``NodeQuarantined`` event; the move to READY says why it waited.
A node that registers again without having been LOST (an agent restart) is not quarantined. Pure: time is
passed in. (A quarantine is not a hold: "hold" is training state kept in memory, docs/DESIGN.md, Glossary.)
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.lifecycle import NodeState
from controller.core.records import NodeRecord


@dataclass(frozen=True)
class Damping:
    rejoin_quarantine_seconds: float = 10.0  # 0: no damping
    rejoin_quarantine_max_seconds: float = 300.0
    flap_memory_seconds: float = 600.0


@dataclass(frozen=True)
class Rejoin:
    """How a new incarnation starts: its flap count, when the name last flapped, until when it waits in JOINING."""

    flaps: int = 0
    flapped_at: float | None = None  # when the incarnation before was LOST (the flap being counted)
    quarantined_until: float | None = None

    def quarantine_seconds(self, now: float) -> float:
        return 0.0 if self.quarantined_until is None else self.quarantined_until - now


def rejoin(previous: NodeRecord | None, now: float, damping: Damping) -> Rejoin:
    """What the previous incarnation of a name says about the next one."""
    if previous is None:
        return Rejoin()
    memory = damping.flap_memory_seconds
    remembered = previous.flapped_at is not None and now - previous.flapped_at <= memory
    earlier = (previous.flaps, previous.flapped_at) if remembered else (0, None)
    if _ended_in_quarantine(previous, now) and previous.flapped_at is not None:
        flaps, flapped_at = previous.flaps + 1, previous.flapped_at  # it went silent again while quarantined
    elif previous.lost_at is None or now - previous.lost_at > memory:  # not LOST (an agent restart), or long ago
        return Rejoin(*earlier)
    else:
        flaps, flapped_at = earlier[0] + 1, previous.lost_at
    seconds = min(damping.rejoin_quarantine_max_seconds, damping.rejoin_quarantine_seconds * 2 ** (flaps - 1))
    return Rejoin(flaps, flapped_at, now + seconds if seconds > 0 else None)


def _ended_in_quarantine(previous: NodeRecord, now: float) -> bool:
    """Whether the incarnation before ended (GONE, or replaced now) while it was still quarantined in JOINING."""
    if previous.quarantined_until is None:
        return False
    ended = previous.state_since if previous.state is NodeState.GONE else now
    return previous.state in (NodeState.GONE, NodeState.JOINING) and ended < previous.quarantined_until


def quarantined(node: NodeRecord, now: float) -> bool:
    """Whether a JOINING node still waits out its quarantine."""
    return node.quarantined_until is not None and now < node.quarantined_until


def release_reason(node: NodeRecord) -> str:
    if node.quarantined_until is None:
        return "first heartbeat"
    return f"stable for {node.quarantined_until - node.joined_at:g} s after flapping ({node.flaps} LOST within memory)"
