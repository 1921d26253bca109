"""Eviction risk (issue 48): the cloud's early warning before any notice. A node at risk gets no new work, and a
running job moves off it in a planned morph only where spare nodes keep its throughput, once per risk."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.causes import MorphCause
from controller.core.intake import essence
from controller.core.invariants import Invariant, violations
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, NodeObservation, RankReport, RecordEvent, StartGeneration
from controller.core.observations import EvictionRisk
from controller.core.reconcile import assignment_for
from controller.core.reconcile.config import Config
from controller.core.reconcile.growth import growth_hint
from controller.core.reconcile.risk import clear_of_risk, memory_whole, move_pays
from controller.core.records import AtRisk
from morphing.planner import Plan
from tests.controller.helpers import job, node, planner, spec
from tests.controller.test_holders import laid
from tests.controller.test_reconcile import CONFIG, Sim, cluster, started

J, N = JobState, NodeState
RISK = EvictionRisk(noticed_at=5.0, source="aws-rebalance-recommendation")


def beat(sim: Sim, name: str, risk: EvictionRisk | None = None) -> None:
    """The node beats again with the ranks it last reported, with or without a risk."""
    ranks = sim.world.observed[name].ranks if name in sim.world.observed else ()
    sim.beat(name, *ranks)
    observed = dict(sim.world.observed)
    observed[name] = replace(observed[name], risk=risk)
    sim.world = replace(sim.world, observed=observed)


def arrive(sim: Sim, name: str, risk: EvictionRisk | None = None) -> None:
    sim.world = replace(sim.world, nodes={**sim.world.nodes, name: node(name, at=sim.now)})
    beat(sim, name, risk)


def events(sim: Sim, kind: str) -> list[RecordEvent]:
    return [c for c in sim.log if isinstance(c, RecordEvent) and c.kind == kind]


def generations(sim: Sim) -> list[StartGeneration]:
    return [c for c in sim.log if isinstance(c, StartGeneration)]


def test_a_risk_is_recorded_once_per_episode_and_its_withdrawal_once() -> None:
    sim = started(4)
    for _ in range(3):
        beat(sim, "node-4", RISK)
        sim.step(1)
    (noticed,) = events(sim, "EvictionRiskNoticed")
    assert (noticed.node, noticed.job) == ("node-4", "j1")
    assert dict(noticed.data) == {"source": "aws-rebalance-recommendation", "noticed_at": 5.0}
    assert sim.world.nodes["node-4"].at_risk == AtRisk(RISK, since=1.0)
    assert sim.world.nodes["node-4"].state is N.ASSIGNED, "a risk is an attribute of the node, not a state"
    sim.world = replace(sim.world, observed={})  # a restarted controller has heard nothing: the risk stays
    sim.step(1)
    assert sim.world.nodes["node-4"].at_risk is not None and not events(sim, "EvictionRiskWithdrawn")
    for _ in range(2):
        beat(sim, "node-4")
        sim.step(1)
    (withdrawn,) = events(sim, "EvictionRiskWithdrawn")
    assert withdrawn.node == "node-4" and withdrawn.data["source"] == RISK.source
    assert sim.world.nodes["node-4"].at_risk is None
    beat(sim, "node-4", replace(RISK, noticed_at=9.0))
    sim.step(1)
    assert len(events(sim, "EvictionRiskNoticed")) == 2, "a new episode is recorded again"


def test_a_new_risk_is_a_change_the_runner_decides_on_at_once() -> None:
    seen = NodeObservation(1, 10.0)
    assert essence(seen) != essence(replace(seen, risk=RISK))
    assert essence(replace(seen, risk=RISK)) == essence(replace(seen, last_seen=11.0, risk=replace(RISK, source="x")))


def test_without_spare_capacity_a_risk_moves_nothing_and_nothing_grows_onto_it() -> None:
    sim = started(4)  # the job runs on every node: none is spare
    sim.run_ranks("j1", step=40, ckpt=30)
    beat(sim, "node-4", RISK)
    sim.step(1)
    arrive(sim, "node-5", RISK)  # a free node at risk is no spare
    for _ in range(3):
        sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().generation == 1 and "node-4" in sim.job().nodes
    assert sim.world.nodes["node-5"].job is None and growth_hint(sim.world, "node-5", sim.now) is None


def test_growth_never_takes_a_node_at_risk_and_takes_it_once_the_risk_is_withdrawn() -> None:
    sim = Sim(cluster(2, job()))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    assert sim.job().state is J.RUNNING and len(sim.job().nodes) == 2
    arrive(sim, "node-3", RISK)
    arrive(sim, "node-4", RISK)
    for _ in range(3):
        sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().generation == 1, "growing onto nodes at risk would pay"
    beat(sim, "node-3")
    beat(sim, "node-4")
    sim.step(1)
    assert sim.job().state is J.MORPHING and sim.job().morph.cause is MorphCause.GROW


def test_admission_places_a_job_on_nodes_at_risk_only_when_no_other_fits() -> None:
    world = cluster(4, job(), job("j2", at=1.0))
    sim = Sim(replace(world, jobs={**world.jobs, "j1": replace(world.jobs["j1"], spec=spec(min_gpus=2))}))
    for name in ("node-1", "node-2"):
        beat(sim, name, RISK)
    for name in ("node-3", "node-4"):
        beat(sim, name)
    sim.step()
    # The scheduler, shown only the nodes a job can rely on, grants both to one job (j2: its first GPU is worth as
    # much as j1's two); j1, granted nothing, is placed on the nodes at risk, since nothing else fits it.
    assert set(sim.job("j2").nodes) == {"node-3", "node-4"}, "the nodes not at risk, as granted"
    assert set(sim.job().nodes) == {"node-1", "node-2"}, "nodes at risk, since nothing else fits j1"


def test_with_a_spare_node_a_running_job_moves_off_a_risk_in_a_planned_morph_losing_no_step() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    sim.step(1)
    arrive(sim, "node-5")
    beat(sim, "node-4", RISK)
    sim.step(1)
    j = sim.job()
    assert j.state is J.MORPHING and j.action is Action.STOP and j.morph.cause is MorphCause.EVICTION_RISK
    assert j.morph.detail.startswith("eviction risk: node-4 (aws-rebalance-recommendation); ")
    assert assignment_for(sim.world, "node-4").action is Action.STOP  # type: ignore[union-attr]
    assert sim.world.nodes["node-4"].state is N.ASSIGNED and sim.world.nodes["node-4"].at_risk.moved_at == 2.0  # type: ignore[union-attr]
    # trainers agree on step 41 and keep it in memory (no checkpoint), exit 0; the node at risk reports too
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=30)
    beat(sim, "node-4", RISK)
    sim.step(1)
    j = sim.job()
    assert j.state is J.RUNNING and j.generation == 2 and j.steps_lost == 0
    assert (j.held.step, j.resume.step) == (41, 30), "the stopped step comes from memory"
    assert "node-4" not in j.nodes and "node-5" in j.nodes and sim.world.nodes["node-4"].job is None
    last = generations(sim)[-1]
    assert last.morph_cause is MorphCause.EVICTION_RISK and "node-4" in last.morph_detail
    for _ in range(3):  # the risk still reported: no second morph, no growth back onto it
        sim.run_ranks("j1", step=45, ckpt=30)
        beat(sim, "node-4", RISK)
        sim.step(1)
    assert sim.job().generation == 2 and sim.world.nodes["node-4"].job is None


def test_a_risk_withdrawn_during_the_move_cancels_nothing_started() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    arrive(sim, "node-5")
    beat(sim, "node-4", RISK)
    sim.step(1)
    assert sim.job().morph.cause is MorphCause.EVICTION_RISK
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=30)
    beat(sim, "node-4")  # withdrawn
    sim.step(1)
    j = sim.job()
    assert j.state is J.RUNNING and j.generation == 2 and j.steps_lost == 0 and j.held.step == 41
    assert len(events(sim, "EvictionRiskWithdrawn")) == 1
    assert generations(sim)[-1].morph_cause is MorphCause.EVICTION_RISK


def test_a_job_moves_off_one_risk_once_even_when_the_spare_node_is_gone_by_then() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    arrive(sim, "node-5")
    beat(sim, "node-4", RISK)
    sim.step(1)
    assert sim.job().morph.cause is MorphCause.EVICTION_RISK
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=30)
    beat(sim, "node-4", RISK)
    beat(sim, "node-5", RISK)  # the spare node is at risk too by the time the trainers stopped
    sim.step(1)
    j = sim.job()
    assert j.state is J.RUNNING and j.generation == 2 and "node-4" in j.nodes, "nothing as fast without it"
    arrive(sim, "node-6")
    for _ in range(3):
        sim.run_ranks("j1", step=45, ckpt=30)
        beat(sim, "node-4", RISK)
        beat(sim, "node-5", RISK)
        sim.step(1)
    assert sim.job().generation == 2 and sim.job().state is J.RUNNING, "never a second morph for the same risk"


def test_moving_off_pays_when_no_slower_and_the_job_outlasts_a_morph() -> None:
    config = Config(morph_cost_seconds=30.0)
    assert move_pays(20.0, 20.0, None, config) is not None
    assert move_pays(20.0, 19.0, None, config) is None, "slower without the node: wait for a notice"
    assert move_pays(20.0, 25.0, 10.0, config) is None, "the job ends before a morph pays"
    assert move_pays(None, 25.0, None, config) is None and move_pays(20.0, None, None, config) is None


def test_a_move_goes_through_memory_only_when_the_ranks_that_stay_hold_every_stage() -> None:
    record = replace(job(), layout=laid(2, 2))  # a: stage 0, b: stage 1, c: stage 0, d: stage 1
    assert memory_whole(record, ["a", "b", "c"])
    assert not memory_whole(record, ["a", "c"]), "stage 1 lives only on the nodes that leave"
    assert memory_whole(replace(record, spec=spec(morph_through_memory=False)), ["a", "c"]), "the stop writes it"


def test_the_next_generation_keeps_a_node_at_risk_only_while_nothing_as_fast_does_without_it() -> None:
    p = planner()
    best, slower = p.plan([(f"n{i}", 1) for i in range(4)]), p.plan([(f"n{i}", 1) for i in range(3)])
    assert isinstance(best, Plan) and isinstance(slower, Plan)
    assert clear_of_risk(best, None, None) is best
    assert clear_of_risk(best, best, 1.0) is best
    assert clear_of_risk(best, slower, None) is best, "slower than the layout on the node at risk"
    assert clear_of_risk(best, slower, slower.samples_per_second) is slower, "as fast as the generation before: taken"


def test_growth_onto_a_node_at_risk_and_a_second_move_off_one_risk_are_violations() -> None:
    sim = started(4)
    world = sim.world
    at = AtRisk(RISK, since=0.0, moved_at=1.0)
    before = replace(world, nodes={**world.nodes, "node-4": replace(world.nodes["node-4"], at_risk=at)})
    after = replace(before, nodes={**before.nodes, "node-4": replace(before.nodes["node-4"], at_risk=at)})
    assert not violations(after, before)
    again = replace(
        after, nodes={**after.nodes, "node-4": replace(after.nodes["node-4"], at_risk=replace(at, moved_at=2.0))}
    )
    assert [v.invariant for v in violations(again, before)] == [Invariant.RISK_MOVED_ONCE]
    shrunk = laid(1, 3, ("node-1", "node-2", "node-3"))
    morphing = replace(sim.job(), state=J.MORPHING, layout=shrunk, action=Action.STOP)
    grew = replace(sim.job(), generation=2, morph=replace(sim.job().morph, cause=MorphCause.GROW))
    was = replace(before, jobs={"j1": morphing})
    now = replace(before, jobs={"j1": grew})
    assert Invariant.GROWTH_AT_RISK in [v.invariant for v in violations(now, was)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["risk", "calm", "arrive", "stop", "beat"]), st.integers(1, 6)),
        max_size=30,
    )
)
def test_every_risk_episode_is_noticed_once_and_moved_off_at_most_once(script: list[tuple[str, int]]) -> None:
    """Random risks, withdrawals, arrivals and stops: every invariant holds after every step (growth never onto a
    node at risk, one move per risk), and each node's risk events alternate, noticed first."""
    sim = Sim(cluster(4, job("a", priority=1), job("b", at=1.0)), replace(CONFIG, morph_cost_seconds=0.5))
    risky: set[str] = set()
    for action, k in script:
        name = f"node-{k}"
        if action == "arrive" and name not in sim.world.nodes:
            sim.world = replace(sim.world, nodes={**sim.world.nodes, name: node(name, at=sim.now)})
        risky = risky | {name} if action == "risk" else risky - {name} if action == "calm" else risky
        for other in sim.world.nodes:
            a = assignment_for(sim.world, other)
            stopping = action == "stop" or (a is not None and a.action is Action.STOP)
            ranks = (
                tuple(RankReport(a.job, a.generation, r, not stopping, 0 if stopping else None, 10, 5) for r in a.ranks)
                if a is not None
                else ()
            )
            sim.beat(other, *ranks)
            observed = dict(sim.world.observed)
            observed[other] = replace(observed[other], risk=RISK if other in risky else None)
            sim.world = replace(sim.world, observed=observed)
        sim.step(2)  # checks controller.core.invariants after the step
    for name in sim.world.nodes:
        kinds = [e.kind for e in sim.log if isinstance(e, RecordEvent) and e.node == name and "Risk" in e.kind]
        assert kinds == ["EvictionRiskNoticed", "EvictionRiskWithdrawn"] * (len(kinds) // 2) + (
            ["EvictionRiskNoticed"] if len(kinds) % 2 else []
        )
    moves = [g for g in generations(sim) if g.morph_cause is MorphCause.EVICTION_RISK]
    assert len(moves) <= len(events(sim, "EvictionRiskNoticed"))
