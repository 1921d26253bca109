"""A failure caused by one node's report, one job or one request never stops decisions for the others.

These drive the runner directly (past the API's validation, which would refuse such reports first), so
what is tested is the shell's own containment: the report is set aside and refused, the job fails with
its reason, the request leaves nothing behind, and health says NOT_SERVING only while nothing decides.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.core import intake
from controller.core.lifecycle import Action, JobState, NodeState
from controller.core.model import Command, NodeObservation, RankReport, World
from controller.core.reconcile import Config
from controller.core.stimulus import Stimulus
from controller.persistence.store import Store
from controller.providers.base import StaticProvider
from controller.shell.failures import DecisionsFailed, Refused
from controller.shell.runner import Runner, RunnerSettings
from tests.controller.helpers import FakeClock, spec, write_profile

EXPIRY = 10.0
Scenario = Callable[[Runner, FakeClock, list[bool]], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario, settings: RunnerSettings | None = None) -> None:
    async def main() -> None:
        clock = FakeClock()
        store = Store(tmp_path / "state.db")
        health: list[bool] = []
        config = Config(heartbeat_expiry_seconds=EXPIRY, debounce_seconds=0.0)
        tuning = settings or RunnerSettings(0.0)
        runner = Runner(store, clock, config, StaticProvider(), None, tuning, health.append)
        try:
            await scenario(runner, clock, health)
        finally:
            await runner.close()
            store.close()

    asyncio.run(main())


def join(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: intake.register(world, name, 1, "127.0.0.1", now)[1]


async def running_job(runner: Runner, clock: FakeClock, tmp_path: Path) -> str:
    for name in ("a", "b"):
        await runner.decide(join(name))
        await runner.observe(name, NodeObservation(1, clock.now()))
    job = await runner.submit(spec(profile=str(write_profile(tmp_path)), min_gpus=2))
    assert runner.jobs[job.id].state is JobState.RUNNING
    return job.id


def test_a_report_that_cannot_be_stored_is_refused_and_the_others_are_decided(tmp_path: Path) -> None:
    async def scenario(runner: Runner, clock: FakeClock, health: list[bool]) -> None:
        job_id = await running_job(runner, clock, tmp_path)
        generation = runner.jobs[job_id].generation
        await runner.decide(join("c"))
        clock.at += 1
        huge = RankReport(job_id, generation, 0, True, None, 5, 2**63)  # more than SQLite holds
        with pytest.raises(Refused, match="OverflowError"):
            await runner.observe("a", NodeObservation(1, clock.now(), (huge,)))
        assert runner.jobs[job_id].last_checkpoint.step == 0 and runner.deciding
        fine = RankReport(job_id, generation, 1, True, None, 7, 4)
        await runner.observe("b", NodeObservation(1, clock.now(), (fine,)))
        assert runner.jobs[job_id].last_checkpoint.step == 4
        clock.at += EXPIRY + 1  # c never beat: decisions go on, so it leaves JOINING
        await runner.tick()
        assert runner.nodes["c"].state is NodeState.GONE and health == []
        assert "ReportRefused" in [e.kind for e in runner.store.events(limit=1000)]

    run(tmp_path, scenario)


def test_one_of_many_reports_in_a_burst_is_found_and_only_it_refused(tmp_path: Path) -> None:
    async def scenario(runner: Runner, clock: FakeClock, health: list[bool]) -> None:
        job_id = await running_job(runner, clock, tmp_path)
        generation = runner.jobs[job_id].generation
        names = [f"n{i}" for i in range(7)]
        for name in names:
            await runner.decide(join(name))
        reports = {name: NodeObservation(1, clock.now()) for name in names}
        reports["a"] = NodeObservation(1, clock.now(), (RankReport(job_id, generation, 0, True, None, 3, 2**64),))
        reports["b"] = NodeObservation(1, clock.now(), (RankReport(job_id, generation, 1, True, None, 3, 2),))
        beats = [runner.observe(name, seen) for name, seen in reports.items()]
        outcomes = dict(zip(reports, await asyncio.gather(*beats, return_exceptions=True), strict=True))
        assert isinstance(outcomes.pop("a"), Refused) and set(outcomes.values()) == {None}
        assert all(runner.nodes[name].state is NodeState.READY for name in names)
        assert runner.jobs[job_id].last_checkpoint.step == 2 and health == []

    run(tmp_path, scenario)


def test_a_job_whose_decisions_fail_fails_with_its_reason_and_the_others_go_on(tmp_path: Path) -> None:
    async def scenario(runner: Runner, clock: FakeClock, health: list[bool]) -> None:
        job_id = await running_job(runner, clock, tmp_path)
        await runner.decide(join("c"))
        planner = runner.planner(runner.jobs[job_id])

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise ZeroDivisionError("a profile the planner cannot take")

        planner.evaluate = broken  # type: ignore[method-assign,union-attr]
        await runner.observe("c", NodeObservation(1, clock.now()))  # a free node: growth asks the planner
        job = runner.jobs[job_id]
        assert job.state is JobState.FAILED and "ZeroDivisionError" in job.reason
        assert runner.nodes["c"].state is NodeState.READY and health == []

    run(tmp_path, scenario)


def test_a_submission_whose_decision_fails_leaves_no_job_and_health_follows_the_loop(tmp_path: Path) -> None:
    async def scenario(runner: Runner, clock: FakeClock, health: list[bool]) -> None:
        store = runner.store
        persist = store.persist

        def full(commands: Any, stimulus: Any = None) -> int:
            raise sqlite3.OperationalError("database or disk is full")

        store.persist = full  # type: ignore[method-assign]
        with pytest.raises(DecisionsFailed, match="disk is full"):
            await runner.submit(spec(profile=str(write_profile(tmp_path))))
        assert runner.jobs == {} and store.load()[1] == {} and health == [False] and not runner.deciding
        await runner.tick()  # still failing: health unchanged, no exception out of a timer
        assert health == [False]
        store.persist = persist  # type: ignore[method-assign]
        await runner.tick()
        assert health == [False, True] and runner.deciding
        assert [e.kind for e in store.events(limit=1000)][-1] == "DecisionsResumed"
        job = await runner.submit(spec(profile=str(write_profile(tmp_path))))
        assert job.id == "job-1" and list(store.load()[1]) == ["job-1"]

    run(tmp_path, scenario)


def test_with_validate_a_decided_world_breaking_an_invariant_is_not_committed(tmp_path: Path) -> None:
    """`spotmorph controller --validate`: real decisions pass the check; a world a bug left wrong (a running job
    told to STOP) is caught before its decision commits, and the job it comes from fails with the invariant."""

    async def scenario(runner: Runner, clock: FakeClock, health: list[bool]) -> None:
        job_id = await running_job(runner, clock, tmp_path)
        runner.jobs[job_id] = replace(runner.jobs[job_id], action=Action.STOP)  # what a buggy decision would leave
        clock.at += 1
        await runner.tick()
        job = runner.jobs[job_id]
        assert job.state is JobState.FAILED and "InvariantViolated" in job.reason, job.reason
        assert f"[state-action] job {job_id} is RUNNING but its trainers are told STOP" in job.reason, job.reason
        [violated] = [e for e in runner.store.events(limit=1000) if e.kind == "InvariantViolated"]
        assert violated.data["invariants"] == ["state-action"] and job_id in violated.data["detail"]
        assert violated.stimulus == Stimulus.tick("tick")  # the decision that broke it, as every decision, says why
        assert runner.deciding and health == []
        assert all(n.job is None for n in runner.nodes.values())
        assert runner.store.load()[1][job_id].state is JobState.FAILED

    run(tmp_path, scenario, RunnerSettings(0.0, validate=True))
