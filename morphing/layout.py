"""Layouts under a fixed global batch.

A layout is how one optimizer step of ``global_batch`` samples is spread over GPUs: ``P`` pipeline
stages, ``D`` data-parallel replicas, micro-batches of ``m`` samples, a contiguous stage -> layers
partition and a rank -> (node, slot) placement. Everything that can be derived (samples per replica,
micro-batches per replica, which samples a replica takes) is derived, never stored, so two layouts
that agree on these fields cannot disagree on anything else.

Ranks are numbered replica-major: ``rank = replica * P + stage``, so the stages of one replica are
neighbouring ranks and a contiguous placement keeps a replica's point-to-point traffic on one node.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from morphing.errors import UserInputError


class InvalidLayout(UserInputError):
    """A layout request that cannot be satisfied; the message says why and what would fix it."""


@dataclass(frozen=True, order=True)
class Slot:
    """One GPU (or CPU slot): the node's name and the slot index on that node."""

    node: str
    slot: int


def split_evenly(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` non-negative ints that differ by at most one, larger ones first."""
    if parts <= 0:
        raise InvalidLayout(f"cannot split {total} into {parts} parts; parts must be >= 1")
    base, extra = divmod(total, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def even_partition(num_layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous ``[first, last_exclusive)`` layer ranges of near-equal length (no profile needed)."""
    problem = partition_problem(num_layers, stages)
    if problem:
        raise InvalidLayout(problem)
    bounds = [0]
    for count in split_evenly(num_layers, stages):
        bounds.append(bounds[-1] + count)
    return tuple(itertools.pairwise(bounds))


def partition_problem(num_layers: int, stages: int) -> str | None:
    if num_layers <= 0:
        return "the model has no layers; the model spec must list at least one layer"
    if stages <= 0:
        return f"pipeline_stages={stages}; use at least 1 stage"
    if stages > num_layers:
        return (
            f"pipeline_stages={stages} > layers={num_layers}; every stage needs a layer, "
            f"use at most {num_layers} stages"
        )
    return None


def contiguous_placement(ranks: int, nodes: Sequence[tuple[str, int]]) -> tuple[Slot, ...]:
    """Ranks filled node by node, slot by slot: ``nodes`` is ``(name, slots)`` in a fixed order."""
    slots = [Slot(name, i) for name, count in nodes for i in range(count)]
    if ranks > len(slots):
        raise InvalidLayout(f"layout needs {ranks} slots but the nodes offer {len(slots)}; add nodes")
    return tuple(slots[:ranks])


def local_nodes(gpus: int, gpus_per_node: int) -> tuple[tuple[str, int], ...]:
    """``gpus`` slots on nodes of ``gpus_per_node``, the last one possibly partial: node-1, node-2, ..."""
    full, rest = divmod(gpus, gpus_per_node)
    counts = [gpus_per_node] * full + ([rest] if rest else [])
    return tuple((f"node-{i + 1}", c) for i, c in enumerate(counts))


@dataclass(frozen=True)
class Layout:
    pipeline_stages: int
    data_parallel: int
    micro_batch_size: int
    global_batch: int
    stage_layers: tuple[tuple[int, int], ...]
    placement: tuple[Slot, ...]

    def __post_init__(self) -> None:
        problem = layout_problem(
            num_layers=self.stage_layers[-1][1] if self.stage_layers else 0,
            pipeline_stages=self.pipeline_stages,
            data_parallel=self.data_parallel,
            micro_batch_size=self.micro_batch_size,
            global_batch=self.global_batch,
        )
        if problem:
            raise InvalidLayout(problem)
        if len(self.stage_layers) != self.pipeline_stages:
            raise InvalidLayout(f"stage_layers has {len(self.stage_layers)} ranges for {self.pipeline_stages} stages")
        expected_first = 0
        for first, last in self.stage_layers:
            if first != expected_first or last <= first:
                raise InvalidLayout(
                    f"stage_layers {list(self.stage_layers)} is not a contiguous partition of the layers"
                )
            expected_first = last
        if len(self.placement) != self.world_size:
            raise InvalidLayout(f"placement has {len(self.placement)} slots for {self.world_size} ranks")
        if len(set(self.placement)) != len(self.placement):
            raise InvalidLayout("placement uses a slot twice")

    @property
    def num_layers(self) -> int:
        return self.stage_layers[-1][1]

    @property
    def world_size(self) -> int:
        return self.pipeline_stages * self.data_parallel

    @property
    def samples_per_replica(self) -> tuple[int, ...]:
        return split_evenly(self.global_batch, self.data_parallel)

    @property
    def micro_batches_per_replica(self) -> tuple[int, ...]:
        m = self.micro_batch_size
        return tuple(-(-n // m) for n in self.samples_per_replica)

    @property
    def max_micro_batches(self) -> int:
        return max(self.micro_batches_per_replica)

    def replica_slice(self, replica: int) -> tuple[int, int]:
        """``[start, stop)`` offsets into the step's ``global_batch`` sample indices for ``replica``."""
        counts = self.samples_per_replica
        start = sum(counts[:replica])
        return start, start + counts[replica]

    def rank(self, replica: int, stage: int) -> int:
        return replica * self.pipeline_stages + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """``(replica, stage)`` of ``rank``."""
        return divmod(rank, self.pipeline_stages)

    def stage_of_layer(self, layer: int) -> int:
        for stage, (first, last) in enumerate(self.stage_layers):
            if first <= layer < last:
                return stage
        raise IndexError(f"layer {layer} is outside 0..{self.num_layers - 1}")

    def nodes(self) -> tuple[str, ...]:
        """Node names in first-use order."""
        return tuple(dict.fromkeys(s.node for s in self.placement))

    def describe(self) -> str:
        return f"{self.pipeline_stages}x{self.data_parallel} (P x D), m={self.micro_batch_size}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline_stages": self.pipeline_stages,
            "data_parallel": self.data_parallel,
            "micro_batch_size": self.micro_batch_size,
            "global_batch": self.global_batch,
            "stage_layers": [list(r) for r in self.stage_layers],
            "samples_per_replica": list(self.samples_per_replica),
            "micro_batches_per_replica": list(self.micro_batches_per_replica),
            "placement": [[s.node, s.slot] for s in self.placement],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        try:
            return cls(
                pipeline_stages=int(data["pipeline_stages"]),
                data_parallel=int(data["data_parallel"]),
                micro_batch_size=int(data["micro_batch_size"]),
                global_batch=int(data["global_batch"]),
                stage_layers=tuple((int(a), int(b)) for a, b in data["stage_layers"]),
                placement=tuple(Slot(str(n), int(s)) for n, s in data["placement"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidLayout):
                raise
            raise InvalidLayout(f"malformed layout: {exc!r}") from exc


def unit_shares(global_batch: int, micro_batch_size: int, replicas: int) -> tuple[tuple[int, int], ...]:
    """Exact mode's split of a step's samples: whole micro-batches (units of ``micro_batch_size`` at fixed
    offsets, the last one short when it does not divide ``global_batch``), spread evenly over ``replicas``."""
    units = -(-global_batch // micro_batch_size)
    if replicas > units:
        raise InvalidLayout(
            f"exact mode: {replicas} replicas for {units} micro-batches of {micro_batch_size} (global batch "
            f"{global_batch}); each replica needs a micro-batch: use at most {units} replicas"
        )
    out, start = [], 0
    for count in split_evenly(units, replicas):
        stop = min(global_batch, start + count * micro_batch_size)
        out.append((start, stop))
        start = stop
    return tuple(out)


def share_of(layout: Layout, replica: int, exact_micro_batch: int | None = None) -> tuple[int, int]:
    """``[start, stop)`` of the step's sample indices that ``replica`` takes; for an exact job (its
    ``micro_batch_size`` given), :func:`unit_shares`, in a layout of that micro-batch size only."""
    if exact_micro_batch is None:
        return layout.replica_slice(replica)
    if layout.micro_batch_size != exact_micro_batch:
        raise InvalidLayout(
            f"exact mode: the layout's micro-batch size is {layout.micro_batch_size}, the job's {exact_micro_batch}; "
            "an exact job runs only its own (its result depends on it)"
        )
    return unit_shares(layout.global_batch, layout.micro_batch_size, layout.data_parallel)[replica]


def default_micro_batch_size(global_batch: int, pipeline_stages: int, data_parallel: int) -> int:
    """The micro-batch size ``spotmorph train`` runs when none is given.

    One stage: the replica's whole share in one micro-batch. Splitting it gains nothing without a
    pipeline to fill and costs a forward and a backward pass per micro-batch (smaller kernels, per-layer
    overheads), so a single-stage layout micro-batches only when asked to, to save memory. P > 1 stages:
    about 2P micro-batches per replica, so the pipeline's bubble is small. Results do not depend on it
    (the batch invariant): only speed and memory do.
    """
    per_replica = -(-global_batch // max(1, data_parallel))
    if pipeline_stages <= 1:
        return max(1, per_replica)
    return max(1, -(-per_replica // (2 * pipeline_stages)))


def layout_problem(
    *, num_layers: int, pipeline_stages: int, data_parallel: int, micro_batch_size: int, global_batch: int
) -> str | None:
    """Why these numbers cannot form a layout, or ``None`` when they can."""
    if global_batch <= 0:
        return f"global_batch={global_batch}; it must be >= 1"
    if data_parallel <= 0:
        return f"data_parallel={data_parallel}; use at least 1 replica"
    if data_parallel > global_batch:
        return (
            f"data_parallel={data_parallel} > global_batch={global_batch}: a replica would get no sample; "
            f"use at most {global_batch} replicas or a larger global batch"
        )
    if micro_batch_size <= 0:
        return f"micro_batch_size={micro_batch_size}; it must be >= 1"
    return partition_problem(num_layers, pipeline_stages)


def make_layout(
    *,
    num_layers: int,
    pipeline_stages: int,
    data_parallel: int,
    micro_batch_size: int,
    global_batch: int,
    nodes: Sequence[tuple[str, int]] | None = None,
    stage_layers: tuple[tuple[int, int], ...] | None = None,
) -> Layout:
    """A validated layout; raises :class:`InvalidLayout` with the reason when the request is impossible.

    Without ``nodes`` every rank gets its own slot on one node called ``local``; without
    ``stage_layers`` the layers are split into near-equal contiguous ranges.
    """
    problem = layout_problem(
        num_layers=num_layers,
        pipeline_stages=pipeline_stages,
        data_parallel=data_parallel,
        micro_batch_size=micro_batch_size,
        global_batch=global_batch,
    )
    if problem:
        raise InvalidLayout(problem)
    world = pipeline_stages * data_parallel
    return Layout(
        pipeline_stages=pipeline_stages,
        data_parallel=data_parallel,
        micro_batch_size=micro_batch_size,
        global_batch=global_batch,
        stage_layers=stage_layers or even_partition(num_layers, pipeline_stages),
        placement=contiguous_placement(world, nodes if nodes is not None else (("local", world),)),
    )
