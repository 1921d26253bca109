"""The pure reconcile core: lifecycles, admission, the morph protocol and its fencing, with a fake clock."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.causes import MorphCause
from controller.core.invariants import check
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import (
    Action,
    JobRecord,
    NodeObservation,
    RankReport,
    RecordCheckpoint,
    RecordEvent,
    ReleaseInstance,
    StartGeneration,
    World,
    apply,
)
from controller.core.reconcile import Config, assignment_for, cancel, reconcile
from controller.core.reconcile.config import PlannerFor
from controller.core.reconcile.growth import measured_rate
from controller.core.records import CheckpointRef
from morphing.jobspec import JobSpec
from tests.controller.helpers import job, node, planner

J, N = JobState, NodeState
CONFIG = Config(heartbeat_expiry_seconds=10, debounce_seconds=0, lost_to_gone_seconds=60, morph_cost_seconds=1)


class Sim:
    """A world stepped by reconcile; the test plays the agents by writing observations."""

    def __init__(self, world: World, config: Config = CONFIG, now: float = 0.0) -> None:
        self.world, self.config, self.now = world, config, now
        self.planners: dict[str, PlannerFor] = {j: planner() for j in world.jobs}
        self.log: list[object] = []

    def beat(self, name: str, *ranks: RankReport, notice: float | None = None) -> None:
        observed = dict(self.world.observed)
        observed[name] = NodeObservation(self.world.nodes[name].incarnation, self.now, ranks, notice)
        self.world = replace(self.world, observed=observed)

    def run_ranks(
        self, job_id: str, running: bool = True, step: int = 0, ckpt: int = 0, code: int | None = None
    ) -> None:
        """Every node of the job reports all its ranks of the current generation."""
        current = self.world.jobs[job_id]
        for name in current.nodes:
            a = assignment_for(self.world, name)
            assert a is not None
            reports = [RankReport(job_id, a.generation, r, running, code, step, ckpt) for r in a.ranks]
            self.beat(name, *reports)

    def step(self, dt: float = 0.0) -> list[object]:
        """One reconcile pass at ``now + dt``; every invariant is checked on what it decided."""
        self.now += dt
        commands = reconcile(self.world, self.now, self.config, self.planners)
        before, self.world = self.world, apply(self.world, commands)
        check(self.world, before)
        self.log.extend(commands)
        return list(commands)

    def job(self, job_id: str = "j1") -> JobRecord:
        return self.world.jobs[job_id]


def state(sim: Sim, name: str) -> NodeState:
    return sim.world.nodes[name].state


def cluster(n: int, *jobs_: JobRecord) -> World:
    nodes = {f"node-{i}": node(f"node-{i}", at=-1.0 + i * 0.001) for i in range(1, n + 1)}
    return World(nodes, {j.id: j for j in jobs_})


def started(n: int = 4) -> Sim:
    sim = Sim(cluster(n, job()))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    assert sim.job().state is J.RUNNING and sim.job().generation == 1
    return sim


def test_joining_node_becomes_ready_on_first_heartbeat() -> None:
    sim = Sim(World({"node-1": node("node-1", N.JOINING)}, {}))
    sim.step()
    assert state(sim, "node-1") == N.JOINING
    sim.beat("node-1")
    sim.step()
    assert state(sim, "node-1") is N.READY


def test_admission_issues_generation_one_and_assignments() -> None:
    sim = started(4)
    j = sim.job()
    assert j.layout is not None and j.action is Action.RUN and j.rendezvous.startswith("127.0.0.1:")
    held = {n for n, rec in sim.world.nodes.items() if rec.job == "j1"}
    assert held == set(j.layout.nodes()) and all(sim.world.nodes[n].state is N.ASSIGNED for n in held)
    ranks = sorted(r for n in held for r in assignment_for(sim.world, n).ranks)  # type: ignore[union-attr]
    assert ranks == list(range(j.layout.world_size))
    first = next(c for c in sim.log if isinstance(c, StartGeneration))
    assert (first.generation, first.morph_cause, first.morph_detail) == (1, MorphCause.ADMITTED, "admitted")


def test_debounce_delays_admission_until_arrivals_settle() -> None:
    world = World({"node-1": node("node-1", at=100.0)}, {"j1": job()})
    sim = Sim(world, replace(CONFIG, debounce_seconds=5), now=101.0)
    sim.beat("node-1")
    sim.step()
    assert sim.job().state is J.QUEUED
    sim.step(4.0)
    assert sim.job().state is J.RUNNING


def test_planned_morph_on_eviction_notice_loses_no_step() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    sim.step(1)
    victim = sim.job().nodes[-1]
    sim.beat(victim, *sim.world.observed[victim].ranks, notice=sim.now + 30)
    sim.step(1)
    assert sim.world.nodes[victim].state is N.DRAINING
    assert sim.job().state is J.MORPHING and sim.job().action is Action.STOP
    assert assignment_for(sim.world, victim).action is Action.STOP  # type: ignore[union-attr]
    # trainers agree on step 41, checkpoint it and exit 0; the draining node reports too
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=41)
    sim.beat(victim, *sim.world.observed[victim].ranks, notice=sim.now + 30)
    sim.step(2)
    j = sim.job()
    assert j.state is J.RUNNING and j.generation == 2 and j.resume.step == 41 and j.steps_lost == 0
    assert j.resume.generation == 1
    assert victim not in j.nodes and sim.world.nodes[victim].job is None
    assert any(isinstance(c, RecordCheckpoint) and c.step == 41 for c in sim.log)
    gens = [c for c in sim.log if isinstance(c, StartGeneration)]
    assert [g.generation for g in gens] == [1, 2] and gens[1].morph_seconds == 2.0
    assert (gens[1].morph_cause, gens[1].morph_detail) == (MorphCause.EVICTION, f"eviction notice: {victim}")


def test_a_generation_its_agents_stopped_for_a_notice_while_no_controller_led_morphs_as_an_eviction() -> None:
    """With no leader, an agent that got a notice stops its generation on its own (worker_agent.agent.evictions): the
    next leader first hears of the notice with the trainers already exited 0 before the last step, while the job's
    action is still RUN. That is the planned stop of an eviction, not a trainer failure."""
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    sim.step(1)
    victim = sim.job().nodes[-1]
    for _ in range(2):  # the first heartbeats the leader hears, and the next ones (agents beat every second)
        sim.run_ranks("j1", running=False, code=0, step=41, ckpt=41)
        sim.beat(victim, *sim.world.observed[victim].ranks, notice=sim.now + 30)
        sim.step(1)
    assert sim.job().state is J.MORPHING or sim.job().generation == 2
    sim.step(2)
    j = sim.job()
    assert j.restarts == 0 and j.steps_lost == 0
    assert j.state is J.RUNNING and j.generation == 2 and j.resume.step == 41 and victim not in j.nodes
    gens = [c for c in sim.log if isinstance(c, StartGeneration)]
    assert gens[-1].morph_cause is MorphCause.EVICTION


def test_unplanned_loss_aborts_survivors_and_resumes_from_checkpoint() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=57, ckpt=50)
    sim.step(1)
    victim = sim.job().nodes[0]
    for _ in range(12):  # every node but the victim keeps beating
        for name in sim.world.nodes:
            if name != victim:
                sim.beat(name, *sim.world.observed[name].ranks)
        sim.step(1)
        if sim.world.nodes[victim].state is N.LOST:
            break
    assert sim.world.nodes[victim].state is N.LOST
    assert sim.job().state is J.MORPHING and sim.job().action is Action.ABORT
    sim.step()
    assert sim.job().state is J.MORPHING  # survivors have not confirmed yet
    for name in sim.job().nodes:
        if name != victim:
            a = assignment_for(sim.world, name)
            assert a is not None
            sim.beat(name, *[RankReport("j1", 1, r, False, -9, 57, 50) for r in a.ranks])
    sim.step()
    j = sim.job()
    assert j.state is J.RUNNING and j.generation == 2 and j.resume.step == 50 and j.steps_lost == 7
    # exactly the checkpoint generation 1 committed: its step and its generation (its directory)
    assert j.resume == CheckpointRef(50, 1)
    resume = assignment_for(sim.world, j.nodes[0])
    assert resume is not None and resume.resume == CheckpointRef(50, 1)
    assert victim not in j.nodes
    assert (j.morph.cause, j.morph.detail) == (MorphCause.NODE_LOST, f"node lost: {victim}")


def test_stale_generation_reports_never_change_the_job() -> None:
    sim = morphed_once()
    name = sim.job().nodes[0]
    sim.beat(name, RankReport("j1", 1, 0, True, None, 999, 999), RankReport("j1", 1, 1, False, 1, 999, 999))
    sim.step()
    j = sim.job()
    assert j.state is J.RUNNING and j.step == 41 and j.last_checkpoint.step == 41 and j.restarts == 0


def morphed_once() -> Sim:
    sim = started(4)
    sim.run_ranks("j1", step=41, ckpt=30)
    victim = sim.job().nodes[-1]
    sim.beat(victim, *sim.world.observed[victim].ranks, notice=100.0)
    sim.step()
    assert sim.job().state is J.MORPHING
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=41)
    sim.step()
    assert sim.job().generation == 2
    return sim


def test_success_releases_nodes() -> None:
    sim = started(2)
    sim.run_ranks("j1", running=False, code=0, step=100, ckpt=100)
    sim.step()
    assert sim.job().state is J.SUCCEEDED
    assert all(n.state is N.READY and n.job is None for n in sim.world.nodes.values())
    assert assignment_for(sim.world, "node-1") is None


def test_trainer_failure_restarts_then_fails_after_max_restarts() -> None:
    sim = started(2)
    for attempt in range(4):
        sim.run_ranks("j1", running=False, code=1, step=3)
        sim.step()
        if attempt < 3:
            assert sim.job().state is J.RUNNING and sim.job().restarts == attempt + 1
            assert sim.job().morph.cause is MorphCause.TRAINER_FAILED
    assert sim.job().state is J.FAILED
    assert all(n.job is None for n in sim.world.nodes.values())


def test_no_fit_requeues_then_resumes_with_next_generation() -> None:
    sim = started(1)
    sim.run_ranks("j1", step=5)
    sim.beat("node-1", *sim.world.observed["node-1"].ranks, notice=50.0)
    sim.step()
    sim.run_ranks("j1", running=False, code=0, step=5, ckpt=5)
    sim.beat("node-1", *sim.world.observed["node-1"].ranks, notice=50.0)  # heartbeats carry a pending notice
    sim.step()
    assert sim.job().state is J.QUEUED and sim.job().generation == 1
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-2": node("node-2", at=sim.now)})
    sim.beat("node-2")
    sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().generation == 2 and sim.job().resume.step == 5
    resumed = [c for c in sim.log if isinstance(c, StartGeneration)][-1]
    assert (resumed.morph_cause, resumed.morph_detail) == (MorphCause.RESUMED, "resumed")


def test_growth_after_debounce_when_it_pays() -> None:
    sim = Sim(cluster(1, job()), replace(CONFIG, debounce_seconds=5))
    sim.beat("node-1")
    sim.step(10)
    assert sim.job().state is J.RUNNING and len(sim.job().nodes) == 1
    nodes = dict(sim.world.nodes)
    for i in (2, 3, 4):
        nodes[f"node-{i}"] = node(f"node-{i}", at=sim.now)
    sim.world = replace(sim.world, nodes=nodes)
    for name in nodes:
        sim.beat(name, *sim.world.observed.get(name, NodeObservation(1, 0)).ranks)
    sim.step(1)
    assert sim.job().state is J.RUNNING  # debounce window still open
    sim.step(5)
    assert sim.job().state is J.MORPHING and sim.job().morph.cause is MorphCause.GROW
    assert sim.job().morph.detail.startswith("grow: ")
    sim.run_ranks("j1", running=False, code=0, step=9, ckpt=9)
    sim.step()
    assert sim.job().state is J.RUNNING and len(sim.job().nodes) > 1


def test_silent_lost_node_becomes_gone_and_is_released() -> None:
    sim = Sim(cluster(1))
    sim.step(11)
    assert state(sim, "node-1") == N.LOST
    sim.step(61)
    assert state(sim, "node-1") is N.GONE
    assert ReleaseInstance("node-1") in sim.log


def test_restart_gives_every_node_a_fresh_heartbeat_window() -> None:
    sim = Sim(replace(cluster(2), started_at=1000.0), now=1005.0)
    sim.step()
    assert all(n.state is N.READY for n in sim.world.nodes.values())
    sim.step(6)
    assert all(n.state is N.LOST for n in sim.world.nodes.values())


def test_cancel_frees_nodes() -> None:
    sim = started(2)
    sim.world = apply(sim.world, cancel(sim.world, "j1", sim.now, "operator"))
    assert sim.job().state is J.CANCELLED and all(n.job is None for n in sim.world.nodes.values())


def test_two_jobs_by_priority_never_share_a_node() -> None:
    low, high = job("low", priority=0, at=0.0), job("high", priority=5, at=1.0)
    sim = Sim(cluster(2, low, high))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    assert sim.world.jobs["high"].state is J.RUNNING
    held = [n.job for n in sim.world.nodes.values()]
    assert "high" in held


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["beat", "notice", "silence", "exit0", "fail", "finish"]), st.integers(1, 4)),
        max_size=40,
    )
)
def test_random_histories_keep_invariants(script: list[tuple[str, int]]) -> None:
    sim = Sim(cluster(4, job("a", priority=1), job("b", at=1.0)))
    silent: set[str] = set()
    for action, k in script:
        name = f"node-{k}"
        if action == "silence":
            silent.add(name)
        for other in sim.world.nodes:
            if other in silent or sim.world.nodes[other].state is N.GONE:
                continue
            a = assignment_for(sim.world, other)
            ranks: tuple[RankReport, ...] = ()
            if a is not None:
                running = action not in {"exit0", "fail", "finish"} or other != name
                code = None if running else (1 if action == "fail" else 0)
                last = 100 if action == "finish" else 10
                ranks = tuple(RankReport(a.job, a.generation, r, running, code, last, 10) for r in a.ranks)
            sim.beat(other, *ranks, notice=50.0 if (action == "notice" and other == name) else None)
        sim.step(3)  # checks controller.core.invariants after the step
    issued = [(c.job_id, c.generation) for c in sim.log if isinstance(c, StartGeneration)]
    assert len(issued) == len(set(issued))


def test_growth_judges_by_the_measured_rate_and_the_time_left() -> None:
    record = replace(job("j1"), state=JobState.RUNNING, state_since=100.0, step=150, resume=CheckpointRef(50, 1))
    rate, scale = measured_rate(record, 110.0, predicted=1000.0)
    assert rate == 100 * record.spec.global_batch / 10.0
    assert scale == rate / 1000.0
    assert measured_rate(replace(record, step=50), 110.0, 1000.0) == (1000.0, 1.0)
    assert measured_rate(record, 110.0, None) == (None, 1.0)


def test_a_node_whose_trainers_cannot_start_is_left_out_of_the_next_generation() -> None:
    sim = started(4)
    first = sim.job()
    broken = first.nodes[-1]
    sim.run_ranks("j1", step=0)
    a = assignment_for(sim.world, broken)
    assert a is not None
    error = "cannot start a trainer with /opt/missing/python: No such file or directory"
    sim.beat(broken, *[RankReport("j1", a.generation, r, False, 127, 0, 0, error) for r in a.ranks])
    sim.step(1)
    job_now = sim.job()
    assert job_now.state is J.MORPHING and job_now.action is Action.ABORT
    assert job_now.exclusions.nodes == (broken,) and job_now.morph.cause is MorphCause.TRAINER_START_FAILED
    assert job_now.restarts == first.restarts, "a broken node is not the job's fault"
    failed = [c for c in sim.log if isinstance(c, RecordEvent) and c.kind == "TrainerStartFailed"]
    assert [(c.node, c.data["error"]) for c in failed] == [(broken, error)]
    sim.beat(broken, *sim.world.observed[broken].ranks)
    for name in first.nodes:
        if name != broken:
            g = assignment_for(sim.world, name)
            assert g is not None
            sim.beat(name, *[RankReport("j1", g.generation, r, False, 1, 0, 0) for r in g.ranks])
    sim.step(1)
    again = sim.job()
    assert again.state is J.RUNNING and again.generation == 2
    assert broken not in again.nodes
    assert sim.world.nodes[broken].job is None


def replace_spec(**fields: object) -> JobSpec:
    return job().spec.model_copy(update=fields)


def test_when_every_node_fails_to_start_the_job_fails_with_the_error() -> None:
    world = cluster(1, replace(job(), spec=replace_spec(max_restarts=0)))
    sim = Sim(world)
    sim.beat("node-1")
    sim.step()
    a = assignment_for(sim.world, "node-1")
    assert a is not None
    error = "ModuleNotFoundError: No module named 'torch'"
    sim.beat("node-1", *[RankReport("j1", a.generation, r, False, 1, 0, 0, error) for r in a.ranks])
    sim.step(1)
    assert sim.job().state is J.FAILED
    assert error in sim.job().reason


def test_declined_growth_is_explained_once_per_free_node_set_and_generation() -> None:
    sim = Sim(cluster(1, job()), replace(CONFIG, debounce_seconds=5, morph_cost_seconds=1e9))
    sim.beat("node-1")
    sim.step(10)
    assert sim.job().state is J.RUNNING

    def arrive(*names: str) -> None:
        nodes = dict(sim.world.nodes)
        for name in names:
            nodes[name] = node(name, at=sim.now)
        sim.world = replace(sim.world, nodes=nodes)

    def settle() -> None:
        for _ in range(4):
            for name in sim.world.nodes:
                sim.beat(name, *sim.world.observed.get(name, NodeObservation(1, 0)).ranks)
            sim.step(3)

    def declined() -> list[RecordEvent]:
        return [c for c in sim.log if isinstance(c, RecordEvent) and c.kind == "GrowthDeclined"]

    arrive("node-2")
    settle()
    assert sim.job().state is J.RUNNING, "a morph that costs more than it gains is declined"
    (first,) = declined()
    assert first.job == "j1" and first.data["free_nodes"] == ["node-2"]
    assert first.data["generation"] == sim.job().generation and first.data["morph_cost_seconds"] == 1e9
    assert first.data["reason"] and first.data["detail"]
    arrive("node-3")
    settle()
    assert [e.data["free_nodes"] for e in declined()] == [["node-2"], ["node-2", "node-3"]]
