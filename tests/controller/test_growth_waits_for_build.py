"""A growth waits while a free node's warm trainer builds the job's model ahead (its heartbeat's ``building``),
up to ``warm_build_wait_seconds`` after the node joined: otherwise a model that takes longer to build than the
debounce is built inside the growth's pause (measured: a 43M growth 3 to 4 VMs held the new rank's build)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from controller.api.agent import SOON_BEAT_SECONDS
from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState
from controller.core.model import NodeObservation, World
from controller.core.reconcile.growth import assignment_soon, growth_hint
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live, running
from tests.controller.helpers import FakeClock, job, node
from tests.controller.test_growth_hint import world as hinted_world
from tests.controller.test_hostile_edge import Node, refusal, running_job
from tests.controller.test_reconcile import CONFIG, Sim, cluster

J = JobState
WAIT = 30.0
GROWING = replace(CONFIG, debounce_seconds=5, warm_build_wait_seconds=WAIT)


def joined(sim: Sim, *names: str) -> None:
    """Free nodes arrive now; every node beats (the running ones with their ranks)."""
    sim.world = replace(sim.world, nodes={**sim.world.nodes, **{n: node(n, at=sim.now) for n in names}})
    for name in sim.world.nodes:
        sim.beat(name, *sim.world.observed.get(name, NodeObservation(1, 0)).ranks)


def building(sim: Sim, name: str, job_id: str) -> None:
    seen = sim.world.observed[name]
    sim.world = replace(sim.world, observed={**sim.world.observed, name: replace(seen, building=job_id)})


def tick(sim: Sim, seconds: float) -> None:
    """Time passes with every node beating as before (no node goes silent); then one reconcile pass."""
    sim.now += seconds
    beaten = {name: replace(seen, last_seen=sim.now) for name, seen in sim.world.observed.items()}
    sim.world = replace(sim.world, observed=beaten)
    sim.step()


def running_sim() -> Sim:
    sim = Sim(cluster(1, job()), GROWING)
    sim.beat("node-1")
    tick(sim, 10)
    assert sim.job().state is J.RUNNING and len(sim.job().nodes) == 1
    return sim


def test_a_growth_waits_for_the_new_nodes_warm_build_then_grows_at_once() -> None:
    sim = running_sim()
    joined(sim, "node-2")
    building(sim, "node-2", "j1")
    tick(sim, 6)
    assert sim.job().state is J.RUNNING, "settled, but the model is still being built on node-2"
    tick(sim, 10)
    assert sim.job().state is J.RUNNING
    building(sim, "node-2", "")
    tick(sim, 0.1)
    assert sim.job().state is J.MORPHING and sim.job().morph.cause is MorphCause.GROW


def test_a_build_that_outlasts_the_wait_no_longer_holds_the_growth() -> None:
    sim = running_sim()
    joined_at = sim.now
    joined(sim, "node-2")
    building(sim, "node-2", "j1")
    tick(sim, WAIT - 0.5)
    assert sim.job().state is J.RUNNING
    tick(sim, 0.5)
    assert sim.now - joined_at >= WAIT and sim.job().state is J.MORPHING, "the new rank builds in the pause"


def test_a_build_of_another_job_holds_nothing() -> None:
    sim = running_sim()
    joined(sim, "node-2")
    building(sim, "node-2", "some-other-job")
    tick(sim, 6)
    assert sim.job().state is J.MORPHING


def test_while_the_hinted_job_waits_a_lower_one_does_not_take_the_node() -> None:
    base = hinted_world()  # job a (priority 0) on node-1, job b (priority 5) on node-2
    sim = Sim(replace(base, nodes={n: r for n, r in base.nodes.items() if n != "free"}), GROWING)
    for name in ("node-1", "node-2"):
        sim.beat(name)
    joined(sim, "node-3")
    building(sim, "node-3", "b")
    tick(sim, 6)
    assert sim.job("a").state is J.RUNNING and sim.job("b").state is J.RUNNING
    building(sim, "node-3", "")
    tick(sim, 0.1)
    assert sim.job("b").state is J.MORPHING, "the node goes to the job it was built for"
    assert sim.job("a").state is J.RUNNING


def test_a_building_node_beats_often_past_the_settling_until_the_wait_ends() -> None:
    base = hinted_world()
    free = replace(base.nodes["free"], joined_at=100.0)
    config = replace(GROWING, debounce_seconds=5.0)
    seen = {"free": NodeObservation(1, 100.0, building="b")}
    world = replace(base, nodes={**base.nodes, "free": free}, observed=seen)

    def soon(w: World, now: float) -> bool:
        return assignment_soon(w, "free", now, config, hinted=growth_hint(w, "free", now) is not None)

    assert soon(world, 120.0), "settled long ago, but its build's end reaches the controller only in a beat"
    assert not soon(world, 100.0 + WAIT + 0.1), "past the wait the growth no longer waits for it"
    assert not soon(replace(world, observed={}), 120.0)


@pytest.fixture
def eager(tmp_path: Path) -> Iterator[Live]:
    """A live controller on a test-moved clock whose policy takes any growth (a morph costs nothing)."""
    with running(tmp_path, FakeClock(1_000_000.0), morph_cost_seconds=0.0) as state:
        yield state


def test_a_live_growth_waits_for_the_build_the_heartbeat_reports_and_the_field_is_checked(eager: Live) -> None:
    assert eager.clock is not None
    busy, job_id, generation = running_job(eager, steps=100_000)

    def action() -> int:
        return busy.beat().assignment.action

    free = Node(eager)
    reply = free.beat(building=job_id)  # JOINING -> READY, its warm trainer building the job's model
    assert not reply.assignment.job and reply.heartbeat_interval_seconds == SOON_BEAT_SECONDS
    for _ in range(3):
        eager.clock.at += 2.0  # past the settling (debounce 0 here), well within the wait
        assert action() == pb.ACTION_RUN, "no growth while the new node builds the model"
        assert free.beat(building=job_id).heartbeat_interval_seconds == SOON_BEAT_SECONDS
    code, detail = refusal(lambda: free.beat(building="../etc/passwd"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "building" in detail
    code, detail = refusal(lambda: free.beat(building="j" * 500))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "building" in detail
    assert action() == pb.ACTION_RUN, "a refused beat changed nothing"
    free.beat(building="job-gone-long-ago")  # a job this controller does not have: dropped, not refused
    assert action() == pb.ACTION_STOP, "built: the growth is decided"
    assert busy.beat().assignment.generation == generation
