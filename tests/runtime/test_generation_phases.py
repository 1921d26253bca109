"""What a generation writes first (generation.plan_writes), a pure phase of its set-up: no process group."""

from __future__ import annotations

from pathlib import Path

from morphing.jobspec import JobSpec
from worker_agent.contract import CommittedCheckpoint, TrainerArguments
from worker_agent.runtime.morph.held import Outcome
from worker_agent.runtime.process.generation import ResumeChoice, Writes, plan_writes

ROOT = Path("/share/ckpt")
JOB = JobSpec(name="j", entrypoint="m.py:build", global_batch=4, steps=10, checkpoint_dir=str(ROOT))


def args(resume: CommittedCheckpoint | None = None) -> TrainerArguments:
    return TrainerArguments(Path("job.json"), Path("layout.json"), 0, "127.0.0.1:1", ROOT, resume=resume)


def test_a_checkpoint_in_the_directory_is_not_written_again_one_from_elsewhere_is() -> None:
    here, elsewhere = ResumeChoice(str(ROOT / "step-00000004-g1"), "", "w"), ResumeChoice("/other/step-4", "", "w")
    assert plan_writes(args(), JOB, 4, None, here) == Writes(already_written=4, durable_due=None)
    assert plan_writes(args(), JOB, 4, None, elsewhere) == Writes(already_written=None, durable_due=None)
    assert plan_writes(args(), JOB, 0, None, ResumeChoice(None, "", "w")) == Writes(0, None)


def test_a_step_resumed_from_memory_only_is_written_after_the_first_step_in_the_background() -> None:
    memory, none = Outcome(True, step=4), ResumeChoice(None, "", "w")
    assert plan_writes(args(), JOB, 4, memory, none) == Writes(already_written=None, durable_due=5)
    assert plan_writes(args(), JOB, 10, memory, none) == Writes(None, 10), "no step left: the held one itself"
    committed = args(CommittedCheckpoint(4, 1))
    assert plan_writes(committed, JOB, 4, memory, none) == Writes(4, None), "the held step is committed already"
    assert plan_writes(args(), JOB, 4, Outcome(False), none) == Writes(4, None), "memory unused: as from the disk"
