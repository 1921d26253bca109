"""The GPUs on offer to the planner, in placement order, and what a contiguous placement implies."""

from __future__ import annotations

from collections.abc import Sequence

from morphing.errors import UserInputError


def check_counts(gpus: int, gpus_per_node: int) -> None:
    if gpus <= 0:
        raise UserInputError(f"--gpus {gpus}: the GPU count must be >= 1")
    if gpus_per_node <= 0:
        raise UserInputError(f"--gpus-per-node {gpus_per_node}: it must be >= 1")


class SlotSpace:
    """The GPUs on offer, in placement order, and what a contiguous placement implies for costs."""

    def __init__(self, nodes: Sequence[tuple[str, int]]) -> None:
        self.nodes = tuple(nodes)
        self.boundaries: list[int] = []
        self.node_index: list[int] = []
        for i, (name, slots) in enumerate(self.nodes):
            if slots < 0:
                raise UserInputError(f"node {name} has {slots} slots; it must be >= 0")
            self.node_index.extend([i] * slots)
            self.boundaries.append(len(self.node_index))
        self.gpus = len(self.node_index)

    def prefix(self, gpus: int) -> SlotSpace:
        """The first ``gpus`` slots (the last node cut short)."""
        kept, left = [], gpus
        for name, slots in self.nodes:
            if left <= 0:
                break
            kept.append((name, min(slots, left)))
            left -= slots
        return SlotSpace(kept)

    def facts(self, stages: int, replicas: int) -> tuple[tuple[bool, ...], tuple[bool, ...], int]:
        """Which stage boundaries cross a node in some replica, which stages' replicas share a node,
        and the most ranks any one node runs."""
        used = stages * replicas
        cross = [False] * (stages - 1)
        crowding, start = 0, 0
        for edge in self.boundaries:
            crowding = max(crowding, min(edge, used) - start)
            start = edge
            if edge >= used:
                break
            position = (edge - 1) % stages
            if position < stages - 1:
                cross[position] = True
        last = (replicas - 1) * stages
        one_node = tuple(self.node_index[s] == self.node_index[last + s] for s in range(stages))
        return tuple(cross), one_node, crowding
