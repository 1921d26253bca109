"""The supervisor with real trainer processes (tiny model, gloo on loopback)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.local.harness import max_rel_diff
from spotmorph.local.processes import alive, port_range_base
from tests.runtime.helpers import TINY, wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.progress import TrainerProgress, absorb
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.contract import (
    CheckpointLoaded,
    CommittedCheckpoint,
    HandOffFailed,
    HeldStateSkipped,
    ProgressEvent,
    ProgressRecord,
    StepCompleted,
    TrainerFailed,
    TrainingFinished,
    parse_progress_line,
    read_progress,
)

FIELDS = '"rank": 0, "generation": 1, "pid": 9, "time": 0.0}'


def loaded_by(supervisor: Supervisor, generation: int) -> list[CheckpointLoaded]:
    """What each rank of job-1's ``generation`` loaded, from its progress file."""
    directory = supervisor.generation_dir("job-1", generation)
    records = [r for p in directory.progress_files().values() for r in read_progress(p)]
    return [r.event for r in records if isinstance(r.event, CheckpointLoaded)]


def test_progress_folds_the_facts_the_agent_reports() -> None:
    said: list[ProgressEvent] = [
        CheckpointLoaded(40, "/ckpt/step-00000040"),
        StepCompleted(41, 0.5, 0.1, 160.0, None),
        StepCompleted(42, 0.4, 0.1, 150.0, 40),
        TrainingFinished(42, 42, 1.0, 0.2),
    ]
    progress = TrainerProgress()
    seen = []
    for event in said:
        progress = absorb(progress, ProgressRecord(event, 0, 1, 9, 0.0))
        seen.append((progress.step, progress.last_checkpoint_step, progress.stepped, progress.finished))
    assert seen == [(40, None, False, False), (41, None, True, False), (42, 40, True, False), (42, 42, True, True)]
    assert (progress.loss, progress.samples_per_second) == (0.4, 150.0)
    failed = absorb(progress, ProgressRecord(TrainerFailed("abort", "peer gone"), 0, 1, 9, 0.0))
    assert failed.error == "peer gone" and failed.step == 42
    skipped = absorb(progress, ProgressRecord(HeldStateSkipped("a peer went silent", "peer_timeout"), 0, 1, 9, 0.0))
    assert (skipped.held_skipped, skipped.held_skipped_cause) == ("a peer went silent", "peer_timeout")
    forged = absorb(progress, ProgressRecord(HeldStateSkipped("why", "rm -rf /"), 0, 1, 9, 0.0))  # a trainer's file
    assert (forged.held_skipped, forged.held_skipped_cause) == ("why", "")
    odd = absorb(progress, parse_progress_line('{"event": "held_skipped", "reason": [1], "cause": [2], ' + FIELDS))
    assert (odd.held_skipped, odd.held_skipped_cause) == ("[1]", "")  # JSON of other types, read as no cause
    handed = absorb(progress, ProgressRecord(HandOffFailed(42, "a layer's checksum did not match"), 0, 1, 9, 0.0))
    assert handed.hand_off_failed == "a layer's checksum did not match" and handed.step == 42
    odd = absorb(progress, parse_progress_line('{"event": "hand_off_failed", "step": 42, "reason": {}, ' + FIELDS))
    assert odd.hand_off_failed == "{}"


def test_the_first_step_of_a_generation_keeps_its_time_and_length() -> None:
    """What the controller splits a morph's pause by: when the first step ended and how long it took."""
    progress = TrainerProgress()
    for at, event in ((10.0, StepCompleted(41, 0.5, 2.5, 160.0, None)), (11.0, StepCompleted(42, 0.4, 1.0, 150.0, 40))):
        progress = absorb(progress, ProgressRecord(event, 0, 1, 9, at))
    assert (progress.first_step_at, progress.first_step_seconds, progress.last_step_at) == (10.0, 2.5, 11.0)
    for said in ('"x"', "true", "null", "[1]"):  # a trainer's file: a length that is no number is no length
        line = '{"event": "step", "step": 1, "loss": 1.0, "step_seconds": ' + said
        rest = ', "samples_per_second": 1.0, "last_checkpoint": null, '
        odd = absorb(TrainerProgress(), parse_progress_line(line + rest + FIELDS))
        assert (odd.first_step_at, odd.first_step_seconds) == (0.0, None)


def new_interpreter(pid: int) -> bool:
    """The trainer ``pid`` is a ``python -m worker_agent.runtime.process.trainer`` (a cold start), not a fork."""
    return b"worker_agent.runtime.process.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def spec(tmp_path: Path, steps: int, memory: bool = True) -> LaunchSpec:
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=2, micro_batch_size=2, global_batch=6)
    job = JobSpec(
        name="supervised",
        entrypoint=TINY,
        global_batch=6,
        seed=3,
        dtype="float64",
        steps=steps,
        checkpoint_interval=0,
        checkpoint_dir=str(tmp_path / "ckpt"),
        timeout_seconds=10.0,
        morph_through_memory=memory,
    )
    return LaunchSpec(job, layout.to_dict(), f"127.0.0.1:{port_range_base(1)}", tmp_path / "ckpt")


@pytest.mark.slow
def test_a_leaving_nodes_stop_checkpoints_and_exits_zero(tmp_path: Path, node_zygote: NodeZygote) -> None:
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())  # a CPU node's
    launch = spec(tmp_path, steps=100_000)
    keys = [TrainerKey("job-1", 1, rank) for rank in range(2)]
    try:
        for key in keys:
            supervisor.start(key, launch)
        wait_for(lambda: all(r.step >= 3 for r in supervisor.reports()), 90, "three steps on both ranks")
        assert not any(new_interpreter(r.pid) for r in supervisor.reports()), "none waits: forks of the zygote"
        supervisor.request_stop("job-1", 1, leaving=True)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 60, "a graceful stop")
        reports = supervisor.reports()
        assert [r.status.exit_code for r in reports] == [0, 0], [supervisor.log_tail(k) for k in keys]
        assert all(r.status.stop_requested for r in reports)
        steps = {r.step for r in reports}
        assert len(steps) == 1, "both ranks stop at the same step boundary"
        assert reports[0].last_checkpoint_step == steps.pop()
        assert not any(alive(r.pid) for r in reports), "a leaving node's trainers keep nothing: they exit"
    finally:
        supervisor.kill_all()


@pytest.mark.slow
def test_a_stop_keeps_the_state_and_the_next_generation_takes_it_from_memory(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "work")
    launch = spec(tmp_path, steps=100_000)
    keys = [TrainerKey("job-1", 1, rank) for rank in range(2)]
    try:
        for key in keys:
            supervisor.start(key, launch)
        wait_for(lambda: all(r.step >= 3 for r in supervisor.reports()), 90, "three steps on both ranks")
        assert all(new_interpreter(r.pid) for r in supervisor.reports()), "no warm trainers, no zygote: cold"
        supervisor.request_stop("job-1", 1)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 60, "a stop that holds")
        reports = supervisor.reports()
        assert [r.status.exit_code for r in reports] == [0, 0], [supervisor.log_tail(k) for k in keys]
        step = reports[0].step
        assert reports[0].last_checkpoint_step is None, "no checkpoint on the stop's critical path"
        holders = [r.pid for r in reports]
        assert all(alive(pid) for pid in holders), "the processes live on, holding their stage"
        nxt = replace(
            launch,
            rendezvous=f"127.0.0.1:{port_range_base(1) + 7}",
            held=CommittedCheckpoint(step, 1),
        )
        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 2, rank), nxt)
        supervisor.forget({("job-1", 2)})
        wait_for(
            lambda: all(r.step >= step + 2 for r in supervisor.reports() if r.status.key.generation == 2), 90, "g2"
        )
        second = [r for r in supervisor.reports() if r.status.key.generation == 2]
        assert sorted(r.pid for r in second) == sorted(holders), "generation 2 runs on the same processes"
        loaded = loaded_by(supervisor, 2)
        assert [(e.step, e.checkpoint) for e in loaded] == [(step, "memory of generation 1")] * 2
        # written once generation 2's first step is done: the step after the held one, in the background
        wait_for(lambda: any(r.last_checkpoint_step == step + 1 for r in supervisor.reports()), 60, "the durable write")
    finally:
        supervisor.kill_all()


# make soak; make test: tests/agent/test_memory_chain.py's chain through memory ends where one process does
@pytest.mark.soak
@pytest.mark.slow
def test_a_generation_from_memory_ends_bit_for_bit_where_one_from_the_disk_ends(tmp_path: Path) -> None:
    """Generation 2 (2 x 1) takes generation 1's (1 x 2) stopped step S from memory and runs to the end; so does
    generation 3 (2 x 1) from the disk, from the checkpoint of S + 1 that generation 2 wrote after its first step
    (not beside it): the ends are equal."""
    supervisor = Supervisor(tmp_path / "work")
    steps = 120
    launch = spec(tmp_path, steps=steps)
    pipeline = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=2, global_batch=6)
    try:
        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 1, rank), launch)
        wait_for(lambda: all(r.step >= 3 for r in supervisor.reports()), 90, "three steps on both ranks")
        supervisor.request_stop("job-1", 1)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 60, "a stop that holds")
        held = supervisor.reports()[0].step
        assert 3 <= held < steps, held
        second = replace(
            launch,
            layout=pipeline.to_dict(),
            rendezvous=f"127.0.0.1:{port_range_base(1) + 7}",
            held=CommittedCheckpoint(held, 1),
        )

        def finished(generation: int) -> bool:
            reports = [r for r in supervisor.reports() if r.status.key.generation == generation]
            return len(reports) == 2 and not any(r.status.running for r in reports)

        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 2, rank), second)
        supervisor.forget({("job-1", 2)})
        wait_for(lambda: finished(2), 120, "generation 2 to finish")
        assert all(r.status.exit_code == 0 and r.step == steps for r in supervisor.reports()), supervisor.reports()
        checkpoints = launch.checkpoint_dir
        from_memory = tmp_path / "from-memory"
        shutil.copytree(checkpoints, from_memory)
        shutil.rmtree(next(checkpoints.glob(f"step-{steps:08d}-*")))  # generation 2's end: g3 makes its own
        assert next(checkpoints.glob(f"step-{held + 1:08d}-g2")), "generation 2 wrote the step after the held one"
        assert not list(checkpoints.glob(f"step-{held:08d}-*")), "and not the held step beside its first step"
        third = replace(
            launch,
            layout=pipeline.to_dict(),
            rendezvous=f"127.0.0.1:{port_range_base(1) + 9}",
            resume=CommittedCheckpoint(held + 1, 2),
        )
        for rank in range(2):
            supervisor.start(TrainerKey("job-1", 3, rank), third)
        supervisor.forget({("job-1", 3)})
        wait_for(lambda: finished(3), 120, "generation 3 to finish")
        loaded = loaded_by(supervisor, 3)
        assert loaded and all(e.step == held + 1 and e.checkpoint.endswith("-g2") for e in loaded), loaded
        assert max_rel_diff(from_memory, checkpoints) == 0.0
    finally:
        supervisor.kill_all()


@pytest.mark.slow
@pytest.mark.parametrize("memory", [True, False], ids=["through memory", "through the disk"])
def test_a_killed_peer_makes_the_survivor_hold_its_step_until_told(
    tmp_path: Path, memory: bool, node_zygote: NodeZygote
) -> None:
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())  # a CPU node's
    launch = spec(tmp_path, steps=100_000, memory=memory)
    keys = [TrainerKey("job-1", 4, rank) for rank in range(2)]
    try:
        for key in keys:
            supervisor.start(key, launch)
        wait_for(lambda: all(r.step >= 1 for r in supervisor.reports()), 90, "a step on both ranks")
        supervisor.kill(keys[1])
        wait_for(lambda: supervisor.newly_held(set()), 40, "the survivor to report its failed collective")
        survivor = supervisor.reports()[0]
        assert survivor.status.running and survivor.held is not None and survivor.error
        assert survivor.step <= survivor.held.step <= survivor.step + 1
        assert not supervisor.newly_held({keys[0]})
        pid = supervisor.reports()[0].pid
        # No salvage order, a stop: through memory the survivor keeps its step for the next generation (its
        # generation ends with success, the process lives on); through the disk it gives up.
        supervisor.request_stop("job-1", 4)
        wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 40, "the survivor to end")
        code = supervisor.reports()[0].status.exit_code
        if memory:
            assert code == 0 and alive(pid), "the survivor keeps the step it held, in its process"
        else:
            assert code not in (None, 0)
    finally:
        supervisor.kill_all()


def test_an_argument_with_a_nul_byte_is_a_failed_trainer_not_an_agent_crash(tmp_path: Path) -> None:
    """A hostile rendezvous address reaches ``Popen`` as an argument: that trainer fails, the agent goes on."""
    supervisor = Supervisor(tmp_path / "work")
    launch = spec(tmp_path, steps=10)
    hostile = LaunchSpec(launch.job, launch.layout, "127.0.0.1\x00:29500", launch.checkpoint_dir)
    key = TrainerKey("job-1", 1, 0)
    supervisor.start(key, hostile)
    (report,) = supervisor.reports()
    assert not report.status.running and report.status.exit_code not in (None, 0)
    assert "null byte" in supervisor.log_tail(key)


def test_warm_trainers_that_cannot_start_are_given_up_and_the_agent_goes_on(tmp_path: Path) -> None:
    missing = Supervisor(tmp_path / "a", python="/nonexistent/bin/python3", warm=2)
    missing.prewarm()  # no exception: warm trainers are an optimisation, cold starts report the failure
    assert missing.warm == 0 and missing.warm_ready() == 0

    dying = Supervisor(tmp_path / "b", python="/bin/false", warm=2)
    for _ in range(3):
        dying.prewarm()
        for warm in dying.warm_trainers.waiting:
            warm.process.wait(10)
    dying.prewarm()
    assert dying.warm == 0, "warm trainers that keep exiting unused are no longer started"
    assert not dying.warm_trainers.waiting
