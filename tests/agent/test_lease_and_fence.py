"""Trainers started by the real supervisor stop by themselves once their lease lapses, a generation whose
fence was raised past it commits nothing more, and the next generation loads exactly the committed
checkpoint (tiny model, gloo on loopback, real processes)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from morphing.layout import make_layout
from tests.agent.test_supervisor import spec
from tests.runtime.helpers import wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.supervisor import Supervisor
from worker_agent.contract import CheckpointLoaded, CommittedCheckpoint, ExitCode, TrainerFailed, read_progress
from worker_agent.runtime.storage import checkpoint as ck
from worker_agent.runtime.storage.fence import Fence, raise_fence

pytestmark = pytest.mark.slow


def failures(supervisor: Supervisor, job: str, generation: int) -> list[TrainerFailed]:
    directory = supervisor.generation_dir(job, generation)
    return [
        r.event
        for path in directory.progress_files().values()
        for r in read_progress(path)
        if isinstance(r.event, TrainerFailed)
    ]


def committed_steps(root: Path, generation: int) -> list[int]:
    return sorted(s for s, g, p in ck.checkpoint_dirs(root) if g == generation and (p / ck.MANIFEST).exists())


def test_trainers_stop_by_themselves_when_their_lease_lapses(tmp_path: Path, node_zygote: NodeZygote) -> None:
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())
    supervisor.lease_seconds = 3.0
    launch = spec(tmp_path, steps=100_000)
    launch = replace(launch, job=launch.job.model_copy(update={"checkpoint_interval": 2}))
    keys = [TrainerKey("job-1", 1, rank) for rank in range(2)]
    try:
        for key in keys:
            supervisor.start(key, launch)

        renewed = [0.0]

        def renewing_until_three_steps() -> bool:
            renewed[0] = time.monotonic()
            supervisor.renew_leases("job-1", 1)  # what every answered heartbeat does
            return all(r.step >= 3 for r in supervisor.reports())

        wait_for(renewing_until_three_steps, 90, "three steps on both ranks")
        lapsed_at = renewed[0] + supervisor.lease_seconds  # the agent is silent from its last renewal on
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 60, "the trainers to stop")
        reports = supervisor.reports()
        assert [r.status.exit_code for r in reports] == [ExitCode.LEASE_EXPIRED] * 2, [
            supervisor.log_tail(k) for k in keys
        ]
        assert time.monotonic() >= lapsed_at
        said = failures(supervisor, "job-1", 1)
        assert [f.kind for f in said] == ["lease_expired"] * 2, said
        # The rank that saw the lapse first names its own lease; a peer may hear of it from that rank's vote.
        assert any("this node's lease ran out" in f.message for f in said), said
        assert all("lease" in f.message and "ran out" in f.message for f in said), said
        stopped_at = {r.step for r in reports}
        assert len(stopped_at) == 1, "every rank stops at the same step boundary"
        assert max(committed_steps(launch.checkpoint_dir, 1), default=0) <= stopped_at.pop()
    finally:
        supervisor.kill_all()


def test_a_fenced_generation_commits_nothing_more_and_the_next_loads_exactly_the_committed_one(
    tmp_path: Path,
    node_zygote: NodeZygote,
) -> None:
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())
    launch = spec(tmp_path, steps=100_000)
    launch = replace(launch, job=launch.job.model_copy(update={"checkpoint_interval": 1, "keep": 100}))
    root = launch.checkpoint_dir
    old = [TrainerKey("job-1", 1, rank) for rank in range(2)]
    try:
        for key in old:
            supervisor.start(key, launch)
        wait_for(lambda: len(committed_steps(root, 1)) >= 4, 90, "four checkpoints of generation 1")
        # The controller committed an older one (say the commits of the newer ones never reached it), and
        # generation 2 raises the fence before it loads anything, while generation 1 still trains.
        committed = committed_steps(root, 1)[1]
        raise_fence(root, Fence("job-1", 2))
        raised = committed_steps(root, 1)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 60, "generation 1 to stop")
        # The ranks agree on the fence at a step boundary and stop together; only a fence raised between that
        # check and a rank's write can stop one rank alone, and its peer then loses it (ABORTED).
        codes = [r.status.exit_code for r in supervisor.reports()]
        assert ExitCode.FENCED in codes and set(codes) <= {ExitCode.FENCED, ExitCode.ABORTED}, codes
        assert "fenced" in {f.kind for f in failures(supervisor, "job-1", 1)}
        late = set(committed_steps(root, 1)) - set(raised)
        assert len(late) <= 1, f"at most the commit already past its fence check when the fence rose: {late}"

        new = [TrainerKey("job-1", 2, rank) for rank in range(2)]
        resumed = replace(launch, rendezvous=spec(tmp_path, 1).rendezvous, resume=CommittedCheckpoint(committed, 1))
        for key in new:
            supervisor.start(key, resumed)
        # A manifest appears before its writer prunes; a writer finishes one checkpoint (pruning included)
        # before it starts the next, so a second commit means the first one's pruning is over.
        wait_for(lambda: len(committed_steps(root, 2)) >= 2, 90, "two checkpoints of generation 2")
        loaded = [
            r.event
            for path in supervisor.generation_dir("job-1", 2).progress_files().values()
            for r in read_progress(path)
            if isinstance(r.event, CheckpointLoaded)
        ]
        assert {(e.step, Path(e.checkpoint).name) for e in loaded} == {(committed, f"step-{committed:08d}-g1")}
        # Generation 2 dropped what generation 1 wrote past the committed checkpoint.
        assert max(committed_steps(root, 1)) == committed
    finally:
        supervisor.kill_all()


def test_a_damaged_file_one_rank_reads_fails_every_rank_as_the_users_error(
    tmp_path: Path, node_zygote: NodeZygote
) -> None:
    """Only the stage that loads a layer file reads it (rank 0 checks the committed checkpoint's manifest, not
    every file, so each byte is read once): the rank that finds it damaged makes every rank fail with the same
    input error, not the others meet it as a lost peer."""
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())
    launch = spec(tmp_path, steps=2)
    root = launch.checkpoint_dir
    try:
        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 1, rank), launch)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 90, "generation 1 to finish")
        assert committed_steps(root, 1) == [2]
        head = ck.step_dir(root, 2, 1) / "head.pt"
        head.write_bytes(b"\0" * head.stat().st_size)  # same size: only reading it tells
        pipeline = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=2, global_batch=6)
        resumed = replace(
            launch,
            job=launch.job.model_copy(update={"steps": 4}),
            layout=pipeline.to_dict(),
            rendezvous=spec(tmp_path, 1).rendezvous,
            resume=CommittedCheckpoint(2, 1),
        )
        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 2, rank), resumed)
        wait_for(
            lambda: all(not r.status.running for r in supervisor.reports() if r.status.key.generation == 2),
            90,
            "generation 2 to fail",
        )
        codes = [r.status.exit_code for r in supervisor.reports() if r.status.key.generation == 2]
        assert codes == [ExitCode.USER_ERROR] * 2, codes
        said = failures(supervisor, "job-1", 2)
        assert [f.kind for f in said] == ["input"] * 2, said
        assert all("step-00000002-g1 is damaged" in f.message and "head.pt" in f.message for f in said), said
    finally:
        supervisor.kill_all()
