"""Peer snapshots in a trainer: copy the stage at a step boundary, stream it to a rank on another node, commit.

Where some stage has a single replica (or all on one node: :func:`morphing.snapshots.plan_snapshots`), every
``snapshot_interval`` steps each rank copies its stage (parameters and optimizer state, exact copies in the
job's dtype) to host memory at the step boundary and keeps that copy; a background thread then sends the copy
of each protected stage to its receiver over a gloo group of its own (bounded by the peer timeout), with the
checksummed point-to-point moves of :mod:`worker_agent.runtime.morph.layer_moves`, and receives the copies this
rank protects. Training goes on meanwhile.

**The commit** rides on the step boundary's all-reduce (:class:`worker_agent.runtime.process.boundary.Said`): each
rank says whether its thread still runs and whether it failed (a checksum that did not match, a peer gone);
every rank sees the same sums, so all alike commit the snapshot in flight (every thread done, none failed: every
receiver acknowledged its copy), drop it (one failed), or wait (one still runs; no new snapshot begins meanwhile,
so the ranks never disagree on the step in flight). A rank keeps the last committed snapshot and the one in
flight (:data:`morphing.snapshots.KEPT_SNAPSHOTS`), so a kill mid-stream still leaves the committed one.

**After a kill** the survivor holds its live step and says which snapshot steps it holds, its own copies and the
copies it received whole (``CollectiveFailed``); the controller takes the newest step every stage has somewhere
(:func:`morphing.snapshots.choose_recovery`). A snapshot rides on the :class:`Held` the rank keeps
(:attr:`Held.snapshots`), so the next generation's exchange offers whichever step it is named: the same plan and
moves as a step held live, from the snapshot holders' memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from morphing.layout import Layout
from morphing.snapshots import SnapshotCosts, SnapshotPlan, due, plan_snapshots, settled_interval
from morphing.transfer import Transfer, stage_range
from worker_agent.runtime.morph.held import Held, keep, payload_bytes
from worker_agent.runtime.morph.layer_moves import move
from worker_agent.runtime.pipeline.comm import peer_world
from worker_agent.runtime.storage.checkpoint import LayerPayload
from worker_agent.runtime.storage.host_buffers import HostLease, HostPool

JOIN_SECONDS = 2.0  # after a failed collective: how long the hold waits for a snapshot thread to end


@dataclass
class Copy:
    """One snapshot step on this rank: its own stage's copy, and the copies it receives (whole once ``done``)."""

    step: int
    own: dict[int, LayerPayload]
    loss_scale: dict[str, Any] | None
    received: dict[int, LayerPayload] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    failure: str = ""  # why the stream failed ("" while it has not)
    lease: HostLease | None = None  # the buffers of ``own``, given back once the snapshot is superseded or dropped
    seconds: float = 0.0  # the copy at the boundary, then the stream added once it ends

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    @property
    def whole(self) -> bool:
        """Every copy this rank receives arrived, checksums matched."""
        return self.done.is_set() and not self.failure


def moves_of(layout: Layout, plan: SnapshotPlan) -> tuple[Transfer, ...]:
    """Every rank's moves of one snapshot, in the one order every rank walks (layer, sender, receiver)."""
    moves = [
        Transfer(layer, route.sender, route.receiver, 0)
        for route in plan.routes
        for layer in stage_range(layout, route.sender)
    ]
    return tuple(sorted(moves))


Copier = Callable[[HostLease], tuple[dict[int, LayerPayload], Any]]
Reduce = Callable[[Sequence[float]], Sequence[float]]


def all_reduce_max(values: Sequence[float]) -> Sequence[float]:
    """The largest of every rank's ``values``, slot by slot (a collective over the default group)."""
    import torch

    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class SnapshotStream:
    """One generation's snapshots on one rank: copies, the background stream, the commit, the interval settled
    from their cost. ``group`` is None when no plan is active (then it does nothing)."""

    def __init__(
        self,
        layout: Layout,
        rank: int,
        interval: int,
        plan: SnapshotPlan,
        group: dist.ProcessGroup | None,
        reduce_max: Reduce = all_reduce_max,
        adapts: bool = True,
    ) -> None:
        self.layout, self.rank, self.interval, self.plan, self.group = layout, rank, interval, plan, group
        self.moves = moves_of(layout, plan)
        self.committed: Copy | None = None
        self.pending: Copy | None = None
        self._thread: threading.Thread | None = None
        self.pool = HostPool()
        self.costs = SnapshotCosts()
        self.settled = not adapts  # a job that keeps its interval whatever it costs has nothing to settle
        self._reduce_max = reduce_max

    def stepped(self, seconds: float) -> None:
        """A step took ``seconds`` (timed until the interval is settled)."""
        if self.active and not self.settled:
            self.costs = self.costs.add_step(seconds)

    @property
    def active(self) -> bool:
        return self.group is not None

    def said(self) -> tuple[bool, bool]:
        """(still streaming, failed) of the snapshot in flight: what this rank says at the boundary."""
        pending = self.pending
        if pending is None:
            return False, False
        return not pending.done.is_set(), bool(pending.failure)

    def at_boundary(self, step: int, running: float, failed: float, copy: Copier) -> int | None:
        """With every rank's sums: commit or drop the snapshot in flight, settle the interval once its first
        snapshots are timed, then begin one of ``step`` when due and none is in flight (``copy`` gives the stage's
        copies, into the lease's buffers, and the loss scale). The interval when it was settled here, else None."""
        if not self.active:
            return None
        settled = None
        if self.pending is not None and running == 0:
            if failed == 0:
                superseded, self.committed, self.pending = self.committed, self.pending, None
                if superseded is not None:
                    superseded.release()
                settled = self._commit_timed(self.committed.seconds)
            else:
                dropped, self.pending = self.pending, None
                dropped.release()
        if self.pending is None and due(step, self.interval) and (self.committed is None or self.committed.step < step):
            started = time.perf_counter()
            lease = self.pool.lease()
            own, scale = copy(lease)
            self.begin(Copy(step, own, scale, lease=lease, seconds=time.perf_counter() - started))
        return settled

    def _commit_timed(self, seconds: float) -> int | None:
        """Time a committed snapshot; once enough are, settle the interval with every rank (a collective: every
        rank commits at the same boundaries, so every rank reaches it at the same one)."""
        if self.settled:
            return None
        self.costs = self.costs.add_snapshot(seconds)
        if not self.costs.ready:
            return None
        cost, step = self.costs.figures()
        slowest, fastest = self._reduce_max([cost, -step])
        self.interval, self.settled = settled_interval(self.interval, slowest, -fastest), True
        return self.interval

    def begin(self, snapshot: Copy) -> None:
        self.pending = snapshot
        self._thread = threading.Thread(target=self._stream, args=(snapshot,), name="spotmorph-snapshot", daemon=True)
        self._thread.start()

    def _stream(self, snapshot: Copy) -> None:
        assert self.group is not None
        started = time.perf_counter()
        try:
            received, bad = move(snapshot.own, self.moves, self.rank, self.group)
        except Exception as exc:  # a peer gone or silent: this snapshot is not whole here
            snapshot.failure = f"the snapshot of step {snapshot.step} lost a peer: {str(exc)[:200]}"
        else:
            snapshot.received, snapshot.failure = received, bad
        finally:
            snapshot.seconds += time.perf_counter() - started
            snapshot.done.set()

    def settle(self, seconds: float = JOIN_SECONDS) -> None:
        """After a failed collective: let the stream in flight end (its group is severed with the others)."""
        thread = self._thread
        if thread is not None:
            thread.join(seconds)

    def holding(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The steps of the copies of its own stage this rank keeps, and of the copies it received whole."""
        copies = [c for c in (self.committed, self.pending) if c is not None]
        own = tuple(sorted(c.step for c in copies))
        got = tuple(sorted(c.step for c in copies if c.whole and self.plan.senders_to(self.rank)))
        return own, got

    def kept(self, job_hash: str, generation: int) -> dict[int, Held]:
        """By step, what this rank offers should the next generation be named that step: its own stage's copy and
        the copies it received whole (a copy received in part is no use)."""
        out = {}
        for snapshot in (self.committed, self.pending):
            if snapshot is None:
                continue
            layers = dict(snapshot.own)
            if snapshot.whole:
                layers.update(snapshot.received)
            out[snapshot.step] = keep(
                layers, job_hash, generation, snapshot.step, self.layout, self.rank, snapshot.loss_scale
            )
        return out

    def nbytes(self) -> int:
        """Host bytes the snapshots hold on this rank."""
        copies = [c for c in (self.committed, self.pending) if c is not None]
        return sum(payload_bytes(p) for c in copies for p in (*c.own.values(), *c.received.values()))


def applies(layout: Layout, interval: int, morph_through_memory: bool) -> SnapshotPlan | None:
    """The plan every rank of the generation computes alike, or None when no snapshot is taken (interval 0, no
    lonely stage, one node only, a job that morphs through the disk: no one would take a snapshot from memory)."""
    if interval <= 0 or not morph_through_memory or layout.world_size < 2:
        return None
    plan = plan_snapshots(layout)
    return plan if plan.active else None


def open_stream(
    layout: Layout, rank: int, interval: int, plan: SnapshotPlan | None, peer_timeout: float, adapts: bool = True
) -> SnapshotStream:
    """A collective when ``plan`` is set (every rank makes the group at the same point): the stream, idle without.
    ``adapts``: the interval is widened once the first snapshots are timed (the job's snapshot_interval_adapts)."""
    if plan is None:
        return SnapshotStream(layout, rank, interval, SnapshotPlan(()), None)
    group = peer_world(layout.world_size, peer_timeout)
    return SnapshotStream(layout, rank, interval, plan, group, adapts=adapts)


def attach(kept: Held, stream: SnapshotStream, job_hash: str, generation: int) -> Held:
    """The held live step, with the snapshots beside it (offered when the next generation is named their step).
    A snapshot of the live step itself adds the copies received to it (its own copy is the live state)."""
    for step, snapshot in stream.kept(job_hash, generation).items():
        if step == kept.step:
            kept.layers = {**snapshot.layers, **kept.layers}
        else:
            kept.snapshots[step] = snapshot
    return kept
