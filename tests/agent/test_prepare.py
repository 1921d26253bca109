"""A free node's warm trainer builds the model of the job a growth may bring, before any assignment.

Real processes: the supervisor's warm trainer is told to prepare a job (the controller's hint) whose user code
fails, which it only notes; told another job, it is ended (it may have run the first job's code) and a fresh one
builds that job's model, once; the trainer it then becomes trains that job bit for bit as a cold trainer does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.local.harness import max_rel_diff
from spotmorph.local.processes import port_range_base
from tests.runtime.helpers import TINY, wait_for
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.supervisor import LaunchSpec, Supervisor

STEPS = 6


def cpu_job(name: str, entrypoint: str, checkpoint_dir: Path, steps: int = STEPS) -> JobSpec:
    """A small float64 job on the CPU, B=4, no periodic checkpoint."""
    return JobSpec(
        name=name,
        entrypoint=entrypoint,
        global_batch=4,
        seed=5,
        dtype="float64",
        device="cpu",
        steps=steps,
        checkpoint_interval=0,
        checkpoint_dir=str(checkpoint_dir),
        timeout_seconds=30.0,
    )


def launch(tmp_path: Path, name: str, port: int) -> LaunchSpec:
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=4)
    job = cpu_job("prepared", TINY, tmp_path / name)
    return LaunchSpec(job, layout.to_dict(), f"127.0.0.1:{port}", tmp_path / name)


def run_to_the_end(supervisor: Supervisor, spec: LaunchSpec) -> None:
    key = TrainerKey("job-1", 1, 0)
    supervisor.start(key, spec)
    wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 120, "the run to finish")
    [report] = supervisor.reports()
    assert report.status.exit_code == 0 and report.step == STEPS, supervisor.log_tail(key)


def warm_log(supervisor: Supervisor) -> str:
    return "".join(w.spool.log_file.read_text() for w in supervisor.warm_trainers.waiting if w.spool.log_file.exists())


@pytest.mark.slow
def test_a_prepared_warm_trainer_trains_bit_for_bit_as_a_cold_one_and_a_broken_hint_is_only_noted(
    tmp_path: Path,
) -> None:
    warm = Supervisor(tmp_path / "warm", warm=1)
    cold = Supervisor(tmp_path / "cold")
    prepared = launch(tmp_path, "warm-ckpt", port_range_base(1))
    broken = prepared.job.model_copy(update={"entrypoint": f"{tmp_path}/missing_model.py:build"})
    try:
        warm.prewarm()
        wait_for(lambda: warm.warm_ready() == 1, 120, "the warm trainer's imports")
        assert warm.building() == ""
        warm.prepare("job-0", broken)
        assert warm.building() == "job-0", "reported until it has tried: a growth onto the node waits for it"
        wait_for(lambda: "cannot build the model ahead" in warm_log(warm), 120, "the failed build noted")
        wait_for(lambda: warm.building() == "", 10, "a failed build no longer reported as under way")
        [waiting] = warm.warm_trainers.waiting
        assert waiting.process.poll() is None, "the warm trainer waits on for a hint or an assignment"
        warm.prepare("job-1", prepared.job)  # another job: the process that tried job-0's code is no use to it
        assert waiting.process.poll() is not None and warm.warm_trainers.waiting == []
        warm.prewarm()
        wait_for(lambda: warm.warm_ready() == 1, 120, "a fresh warm trainer's imports")
        warm.prepare("job-1", prepared.job)
        assert warm.building() == "job-1"
        warm.prepare("job-1", prepared.job)  # every heartbeat repeats the hint: it is built once
        wait_for(lambda: "built prepared's model ahead" in warm_log(warm), 120, "the model built ahead")
        wait_for(lambda: warm.building() == "", 10, "the build reported done")
        warm.prepare("job-1", prepared.job)
        assert warm.building() == "" and warm_log(warm).count("built prepared's model ahead") == 1
        run_to_the_end(warm, prepared)
        reference = launch(tmp_path, "cold-ckpt", port_range_base(1) + 5)
        run_to_the_end(cold, reference)
        assert max_rel_diff(reference.checkpoint_dir, prepared.checkpoint_dir) == 0.0
    finally:
        warm.kill_all()
        cold.kill_all()
