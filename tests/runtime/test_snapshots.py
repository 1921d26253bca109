"""Peer snapshots in real gloo processes: streamed, committed at the boundary, and after a kill taken by the next
world through the held exchange bit for bit (tests/runtime/snapshot_peer.py runs each rank)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from morphing.layout import Layout, Slot, even_partition
from morphing.snapshots import MEASURED_SNAPSHOTS, plan_snapshots
from spotmorph.local.processes import port_range_base
from worker_agent.runtime.morph.snapshots import Copy, SnapshotStream, moves_of
from worker_agent.runtime.storage.host_buffers import HostLease

REPO = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("snapshot_peer.py")
K = 3


def run_world(tmp_path: Path, scenario: str) -> list[dict[str, Any]]:
    port = port_range_base(2)
    outs = [tmp_path / f"rank-{r}.json" for r in range(3)]
    procs = [
        subprocess.Popen([sys.executable, str(PEER), str(r), str(port), scenario, str(outs[r])], cwd=REPO)
        for r in range(3)
    ]
    for proc in procs:
        proc.wait(timeout=120)
    return [json.loads(out.read_text()) if out.exists() else {} for out in outs]


@pytest.mark.slow
def test_a_stage_killed_without_notice_comes_back_from_its_peer_snapshot_bit_for_bit(tmp_path: Path) -> None:
    results = run_world(tmp_path, "kill")
    assert results[2] == {}, "rank 2 was killed"
    for r in results[:2]:
        assert r["live"] == K and r["own"] == [K - 1, K], r  # the committed snapshot and the one in flight
        assert r["recovery"] == ["snapshot", K, 0], r  # stage 2 only in rank 0's copy: nothing lost
        assert r["used"] and r["same"], r
    assert all(r["received"] == [K - 1, K] for r in results[:2]), results  # a ring: 0 keeps 2's copy, 1 keeps 0's


@pytest.mark.slow
def test_a_kill_in_the_middle_of_a_stream_resumes_from_the_committed_snapshot(tmp_path: Path) -> None:
    results = run_world(tmp_path, "midstream")
    assert results[2] == {}
    for r in results[:2]:
        assert r["live"] == K and K in r["own"], r
        assert r["recovery"] == ["snapshot", K - 1, 1], r  # stage 2's copy of K never arrived whole
        assert r["used"] and r["same"], r
    assert results[0]["received"] == [K - 1], results


def three_by_one() -> Layout:
    return Layout(3, 1, 1, 1, even_partition(6, 3), tuple(Slot(f"n{r}", 0) for r in range(3)))


def test_every_rank_walks_the_same_moves_and_the_boundary_commits_only_what_every_rank_has() -> None:
    layout = three_by_one()
    plan = plan_snapshots(layout)
    assert [(m.layer, m.sender, m.receiver) for m in moves_of(layout, plan)] == [
        (0, 0, 1),
        (1, 0, 1),
        (2, 1, 2),
        (3, 1, 2),
        (4, 2, 0),
        (5, 2, 0),
    ]
    stream = SnapshotStream(layout, 0, 2, plan, None)  # no group: inactive, nothing begins
    stream.at_boundary(2, 0, 0, lambda lease: ({}, None))
    assert stream.pending is None and stream.said() == (False, False)
    live = SnapshotStream(layout, 0, 2, plan, None)
    live.pending = Copy(4, {}, None)
    assert live.said() == (True, False)
    live.pending.done.set()
    live.group = object()  # type: ignore[assignment]  # active, without streaming: begin is not reached below
    live.at_boundary(5, running=1, failed=0, copy=lambda lease: ({}, None))
    assert live.pending is not None and live.committed is None, "another rank still streams: nothing commits"
    live.at_boundary(5, running=0, failed=1, copy=lambda lease: ({}, None))
    assert live.pending is None and live.committed is None, "one rank's copy did not arrive whole: dropped alike"


class Timed(SnapshotStream):
    """A stream whose snapshots arrive at once (no group, no thread), each taking ``stream_seconds``."""

    stream_seconds = 0.0

    def begin(self, snapshot: Copy) -> None:
        self.pending = snapshot
        snapshot.seconds += self.stream_seconds
        snapshot.done.set()


def timed(reduce: list[list[float]], stream_seconds: float, rank: int = 0, adapts: bool = True) -> Timed:
    """A 3x1 stream on ``rank``, active, whose all-reduce answers with the slot-wise max of what it is given and
    another rank's figures (``reduce[0]``), recording what it was given in ``reduce``."""
    layout = three_by_one()

    def reduce_max(values: Sequence[float]) -> list[float]:
        reduce.append(list(values))
        return [max(a, b) for a, b in zip(values, reduce[0], strict=True)]

    stream = Timed(layout, rank, 1, plan_snapshots(layout), None, reduce_max, adapts=adapts)
    stream.group = object()  # type: ignore[assignment]
    stream.stream_seconds = stream_seconds
    return stream


def copy_of(weights: torch.Tensor) -> Callable[[HostLease], tuple[dict[int, Any], None]]:
    return lambda lease: ({0: {"tensors": {"w": lease.copy("w", weights)}}}, None)


def test_the_interval_widens_alike_on_every_rank_once_the_first_snapshots_cost_more_than_five_percent() -> None:
    other = [0.5, -1.0]  # another rank: its snapshot costs 0.5 s, its step 1 s
    stream = timed([other], stream_seconds=0.1)
    weights = torch.zeros(4)
    for step in range(1, 5):
        stream.at_boundary(step, 0, 0, copy_of(weights))
        stream.stepped(1.0)
        assert stream.interval == 1 or stream.settled
    assert stream.settled and stream.interval == 10, "the slowest rank's 0.5 s is 50% of a 1 s step: every 10 steps"
    assert stream.costs.ready and len(stream.costs.snapshots) == MEASURED_SNAPSHOTS
    before = stream.interval
    stream.at_boundary(20, 0, 0, copy_of(weights))
    assert stream.interval == before, "settled once: later snapshots are not timed"


def test_a_job_that_keeps_its_interval_snapshots_every_step_whatever_it_costs_and_asks_no_collective() -> None:
    reduced: list[list[float]] = [[0.5, -1.0]]
    stream = timed(reduced, stream_seconds=0.9, adapts=False)
    for step in range(1, 6):
        stream.at_boundary(step, 0, 0, copy_of(torch.zeros(4)))
        stream.stepped(1.0)
        assert stream.committed is None or stream.committed.step == step - 1 or stream.pending is not None
    assert stream.interval == 1 and len(reduced) == 1, "never widened, never timed: no all-reduce was asked for"
    assert stream.pending is not None and stream.pending.step == 5, "a snapshot was begun at every step"


def test_a_snapshot_that_costs_under_five_percent_of_a_step_keeps_the_jobs_interval() -> None:
    stream = timed([[0.0, -2.0]], stream_seconds=0.01)
    for step in range(1, 5):
        stream.at_boundary(step, 0, 0, copy_of(torch.zeros(4)))
        stream.stepped(2.0)
    assert stream.settled and stream.interval == 1


def test_a_superseded_snapshots_buffers_are_reused_by_the_next_one() -> None:
    stream = timed([[0.0, -1.0]], stream_seconds=0.0)
    weights = torch.arange(4.0)
    for step in range(1, 6):
        weights += 1
        stream.at_boundary(step, 0, 0, copy_of(weights))
    assert stream.pool.reused >= 2 and stream.pool.allocated == 2, (stream.pool.reused, stream.pool.allocated)
    assert stream.committed is not None and stream.pending is not None
    assert (
        float(stream.pending.own[0]["tensors"]["w"][0]) == 5.0
        and float(stream.committed.own[0]["tensors"]["w"][0]) == 4.0
    )
