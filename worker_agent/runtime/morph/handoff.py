"""A stop where a node leaves (an eviction notice), through memory: the leaving ranks hand the layers only they
hold to ranks that stay, over a group of every rank of the old generation bounded by the peer timeout
(:func:`worker_agent.runtime.pipeline.comm.peer_world`), and go without writing a checkpoint.

Every rank of the stopping generation calls :func:`hand_off` at the same step boundary (a collective): one
``all_gather_object`` says who leaves and the size of each layer, every rank computes the same moves
(:func:`morphing.transfer.plan_handoff`) and they are sent as a morph's moves are (:func:`layer_moves.move`:
the tensors' bytes, then their XXH3-128 checksum). A staying rank adds what it received to what it keeps, so the next
generation finds every layer of the step in some survivor's memory and writes the step to the disk in the
background. A checksum that does not match, on any rank, leaves memory for the disk: every rank then writes
the step at the stop, as it would without this. A peer that dies mid-way fails the collective, as any lost
peer does (the just-in-time checkpoint path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from morphing.layout import Layout
from morphing.transfer import plan_handoff
from worker_agent.runtime.morph.held import Held, payload_bytes
from worker_agent.runtime.morph.layer_moves import agree, move
from worker_agent.runtime.pipeline.comm import peer_world


@dataclass(frozen=True)
class Handed:
    """What one rank's hand-off did: ``ok`` on every rank or none; the bytes this rank sent and received."""

    ok: bool
    reason: str = ""
    sent: int = 0
    received: int = 0


def hand_off(kept: Held, leaving: bool, layout: Layout, rank: int, peer_timeout: float) -> Handed:
    """Collective over every rank: ``kept`` (this rank's stage at the stop) gains the layers a leaving rank
    hands it; a leaving rank sends and keeps nothing afterwards (the caller drops ``kept``). A peer silent for
    ``peer_timeout`` seconds fails it."""
    group = peer_world(layout.world_size, peer_timeout)
    mine = (leaving, kept.offer().sizes)
    everyone: list[tuple[bool, dict[int, int]] | None] = [None] * layout.world_size
    dist.all_gather_object(everyone, mine, group=group)
    leavers = frozenset(r for r, said in enumerate(everyone) if said is not None and said[0])
    sizes = [
        max((said[1].get(layer, 0) for said in everyone if said is not None), default=0)
        for layer in range(layout.num_layers)
    ]
    moves = plan_handoff(layout, leavers, sizes)
    received, bad = move(kept.layers, moves, rank, group)
    why = agree(bad, group)
    if why:
        return Handed(False, why)
    kept.layers.update(received)
    sent = sum(m.nbytes for m in moves if m.sender == rank)
    return Handed(True, "", sent, sum(payload_bytes(payload) for payload in received.values()))
