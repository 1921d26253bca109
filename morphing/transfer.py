"""Where each layer's state comes from when a job moves from one layout to another.

At a step boundary a layer's state (parameters and optimizer state) is identical on every data-parallel
replica of the stage that holds it, so any surviving process whose old stage held a layer can supply it.
A new rank that held a layer keeps it (OWN); otherwise a surviving holder sends it (PEER); only when no
survivor held it is it read from the durable checkpoint (DISK). Network beats disk, and keeping beats both.

Every rank computes the plan on its own and must walk the same transfers in the same order, so the plan is
a pure function of its inputs: no iteration order of a mapping, no randomness, ties broken by rank.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from morphing.layout import Layout


class HeldSkipCause(enum.StrEnum):
    """Why a generation did not take the step the last one held in memory (and loaded the committed checkpoint
    instead): the trainers' ``HeldStateSkipped``, the agent's report and the controller's event carry it."""

    NOT_HELD = "not_held"  # no trainer of the generation holds that step
    INCONSISTENT = "inconsistent"  # the holders disagree on the job or layout, or claim the same old rank
    LAYERS_MISSING = "layers_missing"  # a layer no trainer of the generation holds, and the step is not committed
    CHECKSUM_MISMATCH = "checksum_mismatch"  # a layer arrived with other bytes than its sender's
    # A failed exchange's class (``ExchangeFailed.cause``, in its generation's failure): the generation ends and its
    # processes hold the step again, so the next one is named it once more; an older agent reported it as a skip.
    PEER_LOST = "peer_lost"  # a peer's connection closed during the exchange (its process died)
    PEER_TIMEOUT = "peer_timeout"  # a peer was silent past the peer timeout during the exchange


class SourceKind(enum.Enum):
    """Where a new rank gets one layer: kept in its own memory, sent by a peer, or read from disk."""

    OWN = "own"
    PEER = "peer"
    DISK = "disk"


@dataclass(frozen=True)
class Source:
    """One layer's origin for one new rank; ``sender`` is the sender's NEW rank for PEER, else ``None``."""

    kind: SourceKind
    sender: int | None = None

    def __post_init__(self) -> None:
        if (self.kind is SourceKind.PEER) != (self.sender is not None):
            raise ValueError(f"a {self.kind.value} source with sender={self.sender}: only a peer source has one")


OWN = Source(SourceKind.OWN)
DISK = Source(SourceKind.DISK)


@dataclass(frozen=True, order=True)
class Transfer:
    """One point-to-point move of one layer's state between two new ranks."""

    layer: int
    sender: int
    receiver: int
    nbytes: int


@dataclass(frozen=True)
class TransferPlan:
    """The source of every layer every new rank needs, plus what survivors held, so they know what to free.

    ``sources`` maps ``(new_rank, layer)`` to its :class:`Source`; ``held`` maps each surviving process's
    new rank to the layers its old stage held; ``layer_bytes[i]`` is layer ``i``'s state size.
    """

    sources: Mapping[tuple[int, int], Source]
    held: Mapping[int, frozenset[int]]
    layer_bytes: tuple[int, ...]

    def transfers(self) -> tuple[Transfer, ...]:
        """The PEER moves sorted by ``(layer, sender, receiver)``: the one order every rank walks."""
        moves = [
            Transfer(layer, source.sender, rank, self.layer_bytes[layer])
            for (rank, layer), source in self.sources.items()
            if source.sender is not None
        ]
        return tuple(sorted(moves))

    def bytes_sent(self) -> dict[int, int]:
        """Bytes each sending new rank sends (ranks that send nothing are absent)."""
        sent: dict[int, int] = {}
        for move in self.transfers():
            sent[move.sender] = sent.get(move.sender, 0) + move.nbytes
        return dict(sorted(sent.items()))

    def from_disk(self) -> frozenset[int]:
        """Layers at least one new rank reads from the checkpoint: the checkpoint must still have them."""
        return frozenset(layer for (_, layer), source in self.sources.items() if source.kind is SourceKind.DISK)

    def needed(self, rank: int) -> frozenset[int]:
        """Layers new rank ``rank`` holds once the move is done."""
        return frozenset(layer for (r, layer) in self.sources if r == rank)

    def dropped(self) -> dict[int, frozenset[int]]:
        """Per surviving new rank, the layers it held but no longer needs (non-empty sets only).

        It may free them only after it has sent them: a dropped layer can still be one it sends.
        """
        drops = {rank: layers - self.needed(rank) for rank, layers in self.held.items()}
        return {rank: layers for rank, layers in sorted(drops.items()) if layers}


def _check(old: Layout, new: Layout, survivors: Mapping[int, int], layer_bytes: Sequence[int]) -> None:
    """Refuse inputs that cannot describe one model moving between two layouts."""
    if old.num_layers != new.num_layers:
        raise ValueError(f"the old layout has {old.num_layers} layers but the new one has {new.num_layers}")
    if len(layer_bytes) != old.num_layers:
        raise ValueError(f"layer_bytes has {len(layer_bytes)} sizes for {old.num_layers} layers")
    negative = [i for i, n in enumerate(layer_bytes) if n < 0]
    if negative:
        raise ValueError(f"layer_bytes is negative for layers {negative}")
    for old_rank, new_rank in sorted(survivors.items()):
        if not 0 <= old_rank < old.world_size:
            raise ValueError(f"survivor old rank {old_rank} is outside the old layout's 0..{old.world_size - 1}")
        if not 0 <= new_rank < new.world_size:
            raise ValueError(
                f"survivor old rank {old_rank} maps to new rank {new_rank}, outside the new layout's "
                f"0..{new.world_size - 1}"
            )
    by_new: dict[int, list[int]] = {}
    for old_rank, new_rank in survivors.items():
        by_new.setdefault(new_rank, []).append(old_rank)
    twice = {n: sorted(o) for n, o in sorted(by_new.items()) if len(o) > 1}
    if twice:
        raise ValueError(f"two old ranks map to one new rank: {twice}")


def stage_range(layout: Layout, rank: int) -> range:
    """The layers rank ``rank``'s stage holds in ``layout``."""
    return range(*layout.stage_layers[layout.coords(rank)[1]])


def _holders(held: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    """Layer -> the ranks that hold it, in rank order."""
    holders: dict[int, list[int]] = {}
    for rank in sorted(held):
        for layer in held[rank]:
            holders.setdefault(layer, []).append(rank)
    return holders


def plan_transfer(
    old: Layout,
    new: Layout,
    survivors: Mapping[int, int],
    layer_bytes: Sequence[int],
    needs: Mapping[int, frozenset[int]] | None = None,
    holds: Mapping[int, frozenset[int]] | None = None,
) -> TransferPlan:
    """Decide, for every layer every new rank needs, whether it keeps it, receives it or reads it from disk.

    ``survivors`` maps OLD rank -> NEW rank for the processes that carry their memory over; any other old
    rank is gone. ``needs`` (by new rank) replaces a rank's stage layers where given: a stage that holds a
    copy of a parameter tied to another stage's layer needs that layer's state too. ``holds`` (by OLD rank)
    replaces a survivor's old stage where given: a survivor that took a leaving rank's layers at the stop
    (:func:`plan_handoff`) holds those too. Senders are balanced
    greedily: PEER needs in order of decreasing layer size (then layer, then receiver), each to the holder
    that has sent the fewest bytes so far, ties to the lowest rank.
    Raises ``ValueError`` naming the problem when the inputs are inconsistent.
    """
    _check(old, new, survivors, layer_bytes)
    held = {
        new_rank: holds[old_rank] if holds is not None and old_rank in holds else frozenset(stage_range(old, old_rank))
        for old_rank, new_rank in sorted(survivors.items())
    }
    for rank, layers in held.items():
        outside = sorted(layer for layer in layers if not 0 <= layer < old.num_layers)
        if outside:
            raise ValueError(f"new rank {rank} holds layers {outside[:8]}, outside the model's {old.num_layers}")
    holders = _holders(held)

    sources: dict[tuple[int, int], Source] = {}
    wanted: list[tuple[int, int]] = []  # (rank, layer) pairs a peer must send
    for rank in range(new.world_size):
        mine = needs.get(rank) if needs is not None else None
        for layer in sorted(mine) if mine is not None else stage_range(new, rank):
            if not 0 <= layer < new.num_layers:
                raise ValueError(f"new rank {rank} needs layer {layer}, outside the model's {new.num_layers}")
            if layer in held.get(rank, frozenset()):
                sources[(rank, layer)] = OWN
            elif layer in holders:
                wanted.append((rank, layer))
            else:
                sources[(rank, layer)] = DISK

    sent = dict.fromkeys(held, 0)
    for rank, layer in sorted(wanted, key=lambda need: (-layer_bytes[need[1]], need[1], need[0])):
        sender = min(holders[layer], key=lambda h: (sent[h], h))
        sent[sender] += layer_bytes[layer]
        sources[(rank, layer)] = Source(SourceKind.PEER, sender)

    ordered = {key: sources[key] for key in sorted(sources)}
    return TransferPlan(
        sources=types.MappingProxyType(ordered),
        held=types.MappingProxyType(held),
        layer_bytes=tuple(layer_bytes),
    )


def plan_handoff(layout: Layout, leaving: frozenset[int], layer_bytes: Sequence[int]) -> tuple[Transfer, ...]:
    """At a stop where some ranks leave (their node has an eviction notice), the moves that leave every layer
    with a rank that stays, so the leavers can go without writing: a layer whose every holder leaves is sent
    by one of them to the staying rank that has received the fewest bytes so far (ties to the lowest rank).

    Ranks are ``layout``'s; no move when every rank leaves (the stop must write) or none does. Layers are
    weighed in order of decreasing size (then index); a leaving stage's layers are sent by its replicas in
    turn, the one that has sent the fewest bytes first.
    """
    if len(layer_bytes) != layout.num_layers:
        raise ValueError(f"layer_bytes has {len(layer_bytes)} sizes for {layout.num_layers} layers")
    outside = sorted(r for r in leaving if not 0 <= r < layout.world_size)
    if outside:
        raise ValueError(f"leaving ranks {outside} are outside the layout's 0..{layout.world_size - 1}")
    staying = [r for r in range(layout.world_size) if r not in leaving]
    if not staying or not leaving:
        return ()
    holders = _holders({rank: stage_range(layout, rank) for rank in range(layout.world_size)})
    orphans = [layer for layer, ranks in holders.items() if all(r in leaving for r in ranks)]
    sent = dict.fromkeys(sorted(leaving), 0)
    received = dict.fromkeys(staying, 0)
    moves = []
    for layer in sorted(orphans, key=lambda i: (-layer_bytes[i], i)):
        sender = min(holders[layer], key=lambda r: (sent[r], r))
        receiver = min(staying, key=lambda r: (received[r], r))
        sent[sender] += layer_bytes[layer]
        received[receiver] += layer_bytes[layer]
        moves.append(Transfer(layer, sender, receiver, layer_bytes[layer]))
    return tuple(sorted(moves))
