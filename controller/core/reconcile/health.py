"""Node liveness: first heartbeats, eviction notices (and their withdrawal), and silence (LOST, then GONE)."""

from __future__ import annotations

from controller.core.commands import ReleaseInstance
from controller.core.flapping import quarantined, release_reason
from controller.core.lifecycle import JOB_ACTIVE, NodeState
from controller.core.model import NodeObservation, NodeRecord
from controller.core.reconcile.config import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import observation
from controller.core.records import AtRisk
from controller.eventlog import facts

N = NodeState
LIVE = frozenset({N.READY, N.ASSIGNED})
GONE_OR_LOST = frozenset({N.GONE, N.LOST})


def node_health(draft: Draft, config: Config) -> None:
    expiry = config.heartbeat_expiry_seconds
    for name in sorted(draft.nodes):
        current = observation(draft, name)
        silent = draft.now - last_seen(draft, draft.nodes[name]) > expiry
        joining = draft.nodes[name]
        if joining.state is N.JOINING and current is not None and not silent and not quarantined(joining, draft.now):
            draft.move_node(name, N.READY, release_reason(joining))
        node = draft.nodes[name]
        if current is not None and current.eviction_not_before is not None and node.state in LIVE:
            draft.event(facts.EvictionNoticed(current.eviction_not_before), node.job, name)
            draft.move_node(name, N.DRAINING, "eviction notice", eviction_not_before=current.eviction_not_before)
        elif current is not None and current.eviction_not_before is None and node.state is N.DRAINING and not silent:
            withdrawn(draft, node)
        note_risk(draft, name, current)
        node = draft.nodes[name]
        if node.suspected_at is not None and current is not None and current.last_seen > node.suspected_at:
            draft.amend_node(name, suspected_at=None)  # heard from since a salvage suspected it: alive after all
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


def note_risk(draft: Draft, name: str, current: NodeObservation | None) -> None:
    """An eviction risk is recorded once per episode: when a heartbeat first carries it, and when one first comes
    without it. Only a heartbeat says the risk is gone: a silent node (or a restarted controller, which has heard
    nothing yet) keeps the risk it had."""
    node = draft.nodes[name]
    if current is None or node.state in GONE_OR_LOST:
        return
    if current.risk is not None and node.at_risk is None:
        draft.event(facts.EvictionRiskNoticed(current.risk.source, current.risk.noticed_at), node.job, name)
        draft.amend_node(name, at_risk=AtRisk(current.risk, draft.now))
    elif current.risk is None and node.at_risk is not None:
        risk = node.at_risk.risk
        draft.event(facts.EvictionRiskWithdrawn(risk.source, risk.noticed_at), node.job, name)
        draft.amend_node(name, at_risk=None)


def withdrawn(draft: Draft, node: NodeRecord) -> None:
    """The agent's heartbeats stopped carrying the notice: the platform withdrew it, so the node stays.

    It goes back to serving its job when the job still holds it (a STOP morph the notice began simply
    finishes, and the next generation may use the node again), else it is free.
    """
    job = draft.jobs.get(node.job) if node.job is not None else None
    draft.event(facts.EvictionWithdrawn(node.eviction_not_before), node.job, node.name)
    if job is not None and job.state in JOB_ACTIVE:
        draft.move_node(node.name, N.ASSIGNED, "eviction notice withdrawn", job=job.id)
    else:
        draft.move_node(node.name, N.READY, "eviction notice withdrawn")


def last_seen(draft: Draft, node: NodeRecord) -> float:
    """When the node's current incarnation was last heard of; a controller restart gives every node a fresh window."""
    base = max(node.state_since, draft.started_at)
    seen = observation(draft, node.name)
    return max(base, seen.last_seen) if seen is not None else base
