"""Forgetting GONE nodes: a record kept for every VM that ever registered grows without end.

A GONE node is forgotten once it has been GONE for ``gone_retention_seconds`` (and at least the flap
memory, so a name that comes back soon is still damped) and no unfinished job's layout names it; its
events stay in the log. The highest incarnation forgotten is remembered (``World.incarnation_floor``):
a name that registers later starts above it, so the node token of a forgotten incarnation never
matches a new one. Pure: the caller passes ``now``.
"""

from __future__ import annotations

from controller.core.commands import Command, ForgetNode
from controller.core.lifecycle import JOB_TERMINAL, NodeState
from controller.core.model import World


def forget_gone(world: World, now: float, retention_seconds: float, memory_seconds: float) -> list[Command]:
    """A :class:`ForgetNode` for each GONE node past its retention that no unfinished job still names."""
    keep = max(retention_seconds, memory_seconds)
    named = {name for job in world.jobs.values() if job.state not in JOB_TERMINAL for name in job.nodes}
    return [
        ForgetNode(node.name, node.incarnation)
        for node in sorted(world.nodes.values(), key=lambda n: n.name)
        if node.state is NodeState.GONE and now - node.state_since >= keep and node.name not in named
    ]
