"""A free node is told which job a growth would most likely bring it (its warm trainers build that model
ahead); a hint never reaches a node that runs something, nor names a job that would not come."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.api.agent import SOON_BEAT_SECONDS
from controller.core.lifecycle import Action, JobState, NodeState
from controller.core.model import Gpu, World
from controller.core.reconcile.config import Config
from controller.core.reconcile.growth import assignment_soon, growth_hint
from controller.core.records import Exclusions
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.helpers import job, node, planner
from tests.controller.test_hostile_edge import Node, running_job

R, N = JobState.RUNNING, NodeState
ONE = planner().plan([("node-1", 1)]).layout  # type: ignore[union-attr]
TWO = planner().plan([("node-2", 1)]).layout  # type: ignore[union-attr]
GPU = (Gpu(0, "H100", 80 << 30),)


def world() -> World:
    """Job ``a`` on node-1, job ``b`` (of a higher priority) on node-2, and a free node."""
    nodes = {
        "node-1": node("node-1", N.ASSIGNED, job="a"),
        "node-2": node("node-2", N.ASSIGNED, job="b"),
        "free": node("free"),
    }
    low = job("a", R, priority=0, layout=ONE)
    high = job("b", R, priority=5, layout=TWO)
    return World(nodes, {"a": low, "b": high})


def test_the_free_node_is_told_the_job_growth_offers_it_first_with_the_spec_its_trainers_get() -> None:
    hint = growth_hint(world(), "free", 10.0)
    assert hint is not None
    job_id, spec = hint
    assert job_id == "b", "the higher priority job is offered free nodes first"
    assert spec.device == "cpu" and spec == world().jobs["b"].spec.model_copy(update={"device": "cpu"})


def test_no_hint_for_a_node_that_is_not_free_or_a_job_that_would_not_come() -> None:
    base = world()
    assert growth_hint(base, "node-1", 10.0) is None, "an assigned node runs its job"
    assert growth_hint(base, "nowhere", 10.0) is None
    joining = replace(base, nodes={**base.nodes, "free": node("free", N.JOINING)})
    assert growth_hint(joining, "free", 10.0) is None
    held = replace(base.jobs["b"], exclusions=Exclusions(until=(("free", 20.0),)))
    only_a = replace(base, jobs={**base.jobs, "b": held})
    assert growth_hint(only_a, "free", 10.0) == ("a", base.jobs["a"].spec.model_copy(update={"device": "cpu"}))
    later = growth_hint(only_a, "free", 25.0)
    assert later is not None and later[0] == "b", "held out only until 20.0"
    stopping = {k: replace(j, state=JobState.MORPHING, action=Action.STOP) for k, j in base.jobs.items()}
    assert growth_hint(replace(base, jobs=stopping), "free", 10.0) is None, "a morphing job grows on its next plan"


def test_no_hint_when_the_job_would_train_on_a_gpu_there() -> None:
    """Only a model on the CPU is kept by a warm trainer: a GPU generation builds its own on its device."""
    base = world()
    gpus = {n: replace(r, gpus=GPU) for n, r in base.nodes.items()}
    assert growth_hint(replace(base, nodes=gpus), "free", 10.0) is None  # device auto resolves to cuda there
    cuda = {k: replace(j, spec=j.spec.model_copy(update={"device": "cuda"})) for k, j in base.jobs.items()}
    assert growth_hint(replace(base, nodes=gpus, jobs=cuda), "free", 10.0) is None
    mixed = {**base.nodes, "free": replace(base.nodes["free"], gpus=GPU)}
    assert growth_hint(replace(base, nodes=mixed), "free", 10.0) is not None, "auto on a CPU job's nodes stays cpu"


def test_a_free_nodes_heartbeat_carries_the_hint_and_an_assigned_ones_does_not(live: Live) -> None:
    busy, job_id, _ = running_job(live)
    assert not busy.beat().HasField("prepare")
    free = Node(live)
    free.beat()  # JOINING -> READY
    reply = free.beat()
    assert not reply.HasField("assignment") or not reply.assignment.job, "growth declined: the node stays free"
    assert reply.prepare.job == job_id and reply.prepare.spec.device == "cpu"
    assert reply.prepare.entrypoint == live.jobs().GetJob(pb.GetJobRequest(id=job_id)).spec.entrypoint


def soon(world: World, name: str, now: float) -> bool:
    """As the heartbeat's reply decides it: with the hint the node is given, if any."""
    config = Config(debounce_seconds=5.0)
    return assignment_soon(world, name, now, config, hinted=growth_hint(world, name, now) is not None)


def test_a_free_node_beats_often_only_while_work_may_reach_it_within_seconds() -> None:
    """While arrivals settle (a growth may be decided) or a job morphs (its next generation may take it)."""
    base = world()
    joined = replace(base, nodes={**base.nodes, "free": replace(base.nodes["free"], joined_at=100.0)})
    assert soon(joined, "free", 104.0), "within the debounce window"
    assert soon(joined, "free", 107.9), "and the grace after it"
    assert not soon(joined, "free", 108.1), "settled, growth declined: 1 Hz again"
    assert not soon(joined, "node-1", 104.0), "an assigned node beats as it does"
    morphing = {**joined.jobs, "a": replace(joined.jobs["a"], state=JobState.MORPHING, action=Action.STOP)}
    assert soon(replace(joined, jobs=morphing), "free", 500.0)
    gpus = {n: replace(r, gpus=GPU) for n, r in joined.nodes.items()}  # no hint: a growth there builds on its GPU
    assert soon(replace(joined, nodes=gpus), "free", 104.0) is False


def test_the_free_nodes_reply_asks_for_fast_beats_while_a_growth_may_come(live: Live) -> None:
    busy, _, _ = running_job(live)
    free = Node(live)
    free.beat()  # JOINING -> READY: it just arrived, a growth onto it may be decided once arrivals settle
    assert free.beat().heartbeat_interval_seconds == SOON_BEAT_SECONDS
    assert busy.beat().heartbeat_interval_seconds == live.controller.settings.heartbeat_interval_seconds


@pytest.mark.slow  # the real planner, for two jobs
def test_while_the_gpus_are_shared_a_free_node_is_told_the_job_granted_it() -> None:
    """A job runs on two nodes; a third arrives as a second job is submitted. Growth's order alone would name the
    running job; the scheduler grants the node to the queued one, which is admitted on it: the hint names it."""
    from controller.core.reconcile.sharing import grants_now
    from tests.controller.test_sharing import cluster, needing, submit

    sim = cluster(2, needing("wide", 2))
    sim.step()
    assert sim.job("wide").state is R
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-3": node("node-3", at=sim.now)})
    assert growth_hint(sim.world, "node-3", sim.now) is not None
    assert growth_hint(sim.world, "node-3", sim.now)[0] == "wide"  # type: ignore[index]  # alone: it grows
    submit(sim, job("small", at=sim.now))
    for name in sim.world.nodes:
        sim.beat(name)
    grants = grants_now(sim.world, sim.now, sim.config, sim.planners)
    assert grants is not None and grants["node-3"] == "small", grants
    hint = growth_hint(sim.world, "node-3", sim.now, grants)
    assert hint is not None and hint[0] == "small", hint
    assert growth_hint(sim.world, "node-3", sim.now, {"node-3": "gone"}) is not None, "a job no longer known: as alone"
    sim.step(1)
    assert sim.job("small").nodes == ("node-3",), "and it is admitted there"


def test_the_grants_behind_the_hints_are_decided_once_per_commit_not_once_per_heartbeat(live: Live) -> None:
    _, job_id, _ = running_job(live)
    free = Node(live)
    free.beat()  # JOINING -> READY: a commit, then its reply decides the grants
    view = live.controller.view
    before = view.grants_decided
    assert before >= 1
    for _ in range(3):
        assert free.beat().prepare.job == job_id  # nothing is committed between these beats
    assert view.grants_decided == before
    live.jobs().CancelJob(pb.CancelJobRequest(id=job_id))  # a commit
    assert not free.beat().prepare.job
    assert view.grants_decided == before + 1
