"""An eviction notice the platform withdraws: the node returns to the live state it left, not stuck DRAINING."""

from __future__ import annotations

from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, RecordEvent
from tests.controller.test_reconcile import Sim, cluster, started

J, N = JobState, NodeState


def notice(sim: Sim, name: str, at: float | None) -> None:
    sim.beat(name, *sim.world.observed[name].ranks, notice=at)


def test_withdrawn_notice_on_a_free_node_makes_it_ready_again() -> None:
    sim = Sim(cluster(1))
    sim.beat("node-1", notice=50.0)
    sim.step()
    assert sim.world.nodes["node-1"].state is N.DRAINING
    notice(sim, "node-1", 50.0)
    sim.step(1)
    assert sim.world.nodes["node-1"].state is N.DRAINING, "a notice still carried keeps it draining"
    notice(sim, "node-1", None)
    commands = sim.step(1)
    node = sim.world.nodes["node-1"]
    assert node.state is N.READY and node.eviction_not_before is None
    assert any(isinstance(c, RecordEvent) and c.kind is EventKind.EVICTION_WITHDRAWN for c in commands)


def test_withdrawn_notice_during_the_stop_it_began_returns_the_node_to_its_job() -> None:
    sim = started(4)
    sim.run_ranks("j1", step=40, ckpt=30)
    sim.step(1)
    victim = sim.job().nodes[-1]
    notice(sim, victim, sim.now + 30)
    sim.step(1)
    assert sim.world.nodes[victim].state is N.DRAINING and sim.job().action is Action.STOP
    notice(sim, victim, None)
    sim.step(1)
    assert sim.world.nodes[victim].state is N.ASSIGNED and sim.world.nodes[victim].job == "j1"
    assert sim.job().state is J.MORPHING, "the STOP simply finishes"
    sim.run_ranks("j1", running=False, code=0, step=41, ckpt=41)
    sim.step(1)
    job = sim.job()
    assert job.state is J.RUNNING and job.generation == 2 and job.resume.step == 41
    assert victim in job.nodes, "the next generation may use the node again"


def test_a_silent_draining_node_is_gone_not_withdrawn() -> None:
    sim = Sim(cluster(1))
    sim.beat("node-1", notice=50.0)
    sim.step()
    sim.step(11)
    assert sim.world.nodes["node-1"].state is N.GONE
