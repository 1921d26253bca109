"""No job runs another job's code (issue 44, finding 1) and no assignment waits on another job's build (2).

Real processes. Jobs A and B live in folders of their own, each with a ``helpers.py`` (a common name) whose
``WEIGHT`` scales the loss: A's 1, B's 3. A warm trainer builds A's model ahead (the controller's growth hint:
``import helpers`` puts A's module in ``sys.modules``), then B is assigned to the node. B must train with its
own helpers: its reported losses equal those of B trained by a cold trainer, bit for bit (with A's helpers they
are a third of them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.local.processes import port_range_base
from tests.agent.test_prepare import cpu_job
from tests.runtime.helpers import REPO, wait_for
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.holders import Warm
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.contract import StepCompleted, events_of, read_progress

pytestmark = pytest.mark.slow
STEPS = 3
MODEL = f"""
import dataclasses
import importlib.util
import time

import helpers  # the colliding name: each job's own folder holds one

_spec = importlib.util.spec_from_file_location("tiny_gpt", "{REPO}/examples/tiny_gpt.py")
tiny_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_gpt)


def weighted(logits, targets):
    return tiny_gpt.per_sample_loss(logits, targets) * helpers.WEIGHT


def build():
    time.sleep(helpers.BUILD_SECONDS)
    return dataclasses.replace(tiny_gpt.build_tiny(), loss=weighted)
"""


def job_in(folder: Path, weight: float, build_seconds: float = 0.0) -> JobSpec:
    folder.mkdir(parents=True)
    (folder / "helpers.py").write_text(f"WEIGHT = {weight}\nBUILD_SECONDS = {build_seconds}\n")
    (folder / "model.py").write_text(MODEL)
    return cpu_job(folder.name, f"{folder}/model.py:build", folder / "ckpt", STEPS)


def launch(job: JobSpec, folder: Path, port: int) -> LaunchSpec:
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=4)
    return LaunchSpec(job, layout.to_dict(), f"127.0.0.1:{port}", folder)


def losses(supervisor: Supervisor, job_id: str, spec: LaunchSpec) -> list[float]:
    key = TrainerKey(job_id, 1, 0)
    supervisor.start(key, spec)
    wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 120, f"{job_id} to finish")
    [report] = [r for r in supervisor.reports() if r.status.key == key]
    assert report.status.exit_code == 0 and report.step == STEPS, supervisor.log_tail(key)
    events = events_of(read_progress(supervisor.generation_dir(job_id, 1).progress_file(0)), StepCompleted)
    return [e.loss for e in events]


def warm_log(warm: Warm) -> str:
    return warm.spool.log_file.read_text() if warm.spool.log_file.exists() else ""


def built_ahead(supervisor: Supervisor, job_id: str, job: JobSpec) -> Warm:
    supervisor.prewarm()
    wait_for(lambda: supervisor.warm_ready() == 1, 120, "the warm trainer's imports")
    supervisor.prepare(job_id, job)
    [warm] = supervisor.warm_trainers.waiting
    wait_for(lambda: "model ahead" in warm_log(warm), 120, "the build ahead")
    return warm


def test_a_job_never_trains_with_the_modules_another_job_built_ahead(tmp_path: Path) -> None:
    a, b = job_in(tmp_path / "a", 1.0), job_in(tmp_path / "b", 3.0)
    warm, cold = Supervisor(tmp_path / "warm", warm=1), Supervisor(tmp_path / "cold")
    try:
        foreign = built_ahead(warm, "job-a", a)
        assert "built a's model ahead" in warm_log(foreign)
        got = losses(warm, "job-b", launch(b, tmp_path / "b-warm", port_range_base(1)))
        assert foreign.process.poll() is not None, "the process that ran A's code was ended"
        want = losses(cold, "job-b", launch(b, tmp_path / "b-cold", port_range_base(1) + 5))
        assert got == want, (got, want)
        # And A, on a node whose warm trainer built it ahead, trains with its own code: a third of B's losses.
        again = built_ahead(warm, "job-a", a)
        mine = losses(warm, "job-a", launch(a, tmp_path / "a-warm", port_range_base(1) + 10))
        assert again.process.pid in {t.process.pid for t in warm._trainers.values()}, "the prepared one was used"
        assert mine == pytest.approx([w / 3 for w in want], rel=1e-6)  # AdamW nearly undoes the weight
    finally:
        warm.kill_all()
        cold.kill_all()


@pytest.mark.soak  # make soak; make test: the foreign-code refusal itself, above, and tests/agent/test_code_identity.py
def test_a_warm_trainer_handed_another_jobs_assignment_anyway_starts_afresh(tmp_path: Path) -> None:
    """The trainer's own check, behind the agent's: handed B's assignment after running A's code (as the agent
    used to), it runs B in a fresh interpreter (same process id, so the agent's handle holds)."""
    a, b = job_in(tmp_path / "a", 1.0), job_in(tmp_path / "b", 3.0)
    warm, cold = Supervisor(tmp_path / "warm", warm=1), Supervisor(tmp_path / "cold")
    try:
        foreign = built_ahead(warm, "job-a", a)
        warm.warm_trainers.take = lambda job_id, job: warm.warm_trainers.waiting.pop(0)  # type: ignore[method-assign]
        got = losses(warm, "job-b", launch(b, tmp_path / "b-warm", port_range_base(1)))
        log = warm.log_tail(TrainerKey("job-b", 1, 0), lines=50)  # the trainer's own lines follow the warning
        assert "ran another job's code building a model ahead; the trainer starts afresh" in log
        assert foreign.process.pid in {t.process.pid for t in warm._trainers.values()}
        want = losses(cold, "job-b", launch(b, tmp_path / "b-cold", port_range_base(1) + 5))
        assert got == want, (got, want)
    finally:
        warm.kill_all()
        cold.kill_all()


@pytest.mark.soak  # make soak; make test: the preparation deadline in tests/agent/test_prepare.py
def test_an_assignment_waits_on_no_foreign_build_and_a_build_ahead_has_a_deadline(tmp_path: Path) -> None:
    slow, b = job_in(tmp_path / "slow", 1.0, build_seconds=600), job_in(tmp_path / "b", 3.0)
    env = {**os.environ, "SPOTMORPH_PREPARE_SECONDS": "3"}
    warm = Supervisor(tmp_path / "warm", warm=1, env=env)
    try:
        warm.prewarm()
        wait_for(lambda: warm.warm_ready() == 1, 120, "the warm trainer's imports")
        warm.prepare("job-slow", slow)
        [building] = warm.warm_trainers.waiting
        assert warm.building() == "job-slow"
        losses(warm, "job-b", launch(b, tmp_path / "b-warm", port_range_base(1)))  # not after the 600 s build
        assert building.process.poll() is not None, "the process building the slow job was ended for B"
        warm.warm_trainers.replenish()
        wait_for(lambda: warm.warm_ready() == 1, 120, "a new warm trainer")
        warm.prepare("job-slow", slow)
        [again] = warm.warm_trainers.waiting
        wait_for(lambda: "abandoned building the model ahead" in warm_log(again), 60, "the build abandoned")
        assert "past its deadline of 3 s (SPOTMORPH_PREPARE_SECONDS)" in warm_log(again)
        wait_for(lambda: warm.building() == "", 10, "the abandoned build no longer reported as under way")
        assert again.process.poll() is None, "it waits on for an assignment of its own job"
    finally:
        warm.kill_all()
