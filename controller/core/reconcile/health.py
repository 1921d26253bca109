"""Node liveness: first heartbeats, eviction notices, and silence (LOST, then GONE and released)."""

from __future__ import annotations

from controller.core.commands import ReleaseInstance
from controller.core.events import EventKind
from controller.core.lifecycle import NodeState
from controller.core.model import NodeRecord
from controller.core.reconcile.config import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import observation

N = NodeState
LIVE = frozenset({N.READY, N.ASSIGNED})


def node_health(draft: Draft, config: Config) -> None:
    expiry = config.heartbeat_expiry_seconds
    for name in sorted(draft.nodes):
        current = observation(draft, name)
        silent = draft.now - last_seen(draft, draft.nodes[name]) > expiry
        if draft.nodes[name].state is N.JOINING and current is not None and not silent:
            draft.move_node(name, N.READY, "first heartbeat")
        node = draft.nodes[name]
        if current is not None and current.eviction_not_before is not None and node.state in LIVE:
            draft.event(EventKind.EVICTION_NOTICED, node.job, name, not_before=current.eviction_not_before)
            draft.move_node(name, N.DRAINING, "eviction notice", eviction_not_before=current.eviction_not_before)
        node = draft.nodes[name]
        if not silent:
            continue
        if node.state in LIVE:
            draft.move_node(name, N.LOST, f"no heartbeat for {expiry:g} s")
        elif node.state in {N.JOINING, N.DRAINING}:
            draft.move_node(name, N.GONE, "heartbeats stopped")
            draft.issue(ReleaseInstance(name))
        elif node.state is N.LOST and draft.now - node.state_since > config.lost_to_gone_seconds:
            draft.move_node(name, N.GONE, f"lost for {config.lost_to_gone_seconds:g} s")
            draft.issue(ReleaseInstance(name))


def last_seen(draft: Draft, node: NodeRecord) -> float:
    """When the node's current incarnation was last heard of; a controller restart gives every node a fresh window."""
    base = max(node.state_since, draft.started_at)
    seen = observation(draft, node.name)
    return max(base, seen.last_seen) if seen is not None else base
