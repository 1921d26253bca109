"""A node its peers cannot reach (partitioned from the other VMs, not from the controller), with a fake clock.

It beats on, so it is never LOST; what gives it away is the rendezvous of the generations it is in: the
nodes that cannot reach the rendezvous host fail to start while the host waits. One such failure cannot
say which end is cut off; a node that failed with two different partners is implicated and left out for
a while, and the nodes left out because of it are taken back (controller.core.reconcile.unreachable).
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState
from controller.core.model import Action, RankReport, RecordEvent
from controller.core.reconcile import assignment_for
from controller.core.reconcile.unreachable import held_out, judge
from controller.core.records import Exclusions
from tests.controller.helpers import job
from tests.controller.test_reconcile import CONFIG, Sim, cluster

J = JobState
ERROR = "DistNetworkError('The client socket has timed out after 60000ms while trying to connect to (10.0.0.1, 1)')"


def running(sim: Sim, names: list[str] | None = None) -> None:
    """Every node of the current generation (or ``names``) runs its ranks."""
    current = sim.job()
    for name in current.nodes if names is None else names:
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(name, *[RankReport("j1", a.generation, r, True, None, current.resume.step) for r in a.ranks])


def cannot_start(sim: Sim, names: list[str]) -> None:
    """The trainers of ``names`` exit before their first step: they could not reach the rendezvous."""
    for name in names:
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(name, *[RankReport("j1", a.generation, r, False, 1, 0, 0, ERROR) for r in a.ranks])


def end_generation(sim: Sim) -> None:
    """The old generation's ranks are all gone (the ABORT killed the rest); the next one is issued."""
    current = sim.job()
    for name in current.nodes:
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(name, *[RankReport("j1", a.generation, r, False, 1, 0, 0) for r in a.ranks])
    sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().generation == current.generation + 1


def host(sim: Sim) -> str:
    layout = sim.job().layout
    assert layout is not None
    return str(layout.placement[0].node)


def implicated(sim: Sim) -> list[RecordEvent]:
    return [c for c in sim.log if isinstance(c, RecordEvent) and c.kind == "NodeImplicated"]


def start(n: int) -> Sim:
    sim = Sim(cluster(n, job()))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    assert sim.job().state is J.RUNNING
    return sim


def test_a_host_none_of_its_peers_can_reach_is_implicated_at_once_and_left_out_for_a_while() -> None:
    sim = start(4)
    cut = host(sim)
    spokes = [n for n in sim.job().nodes if n != cut]
    assert len(spokes) >= 2, sim.job().layout
    running(sim, [cut])  # the host waits for the others, longer than they try to reach it
    cannot_start(sim, spokes)
    sim.step(1)
    now = sim.job()
    assert now.state is J.MORPHING and now.action is Action.ABORT and now.morph.cause is MorphCause.PEER_UNREACHABLE
    (event,) = implicated(sim)
    assert event.node == cut and event.data["partners"] == sorted(spokes)
    assert event.data["until"] == sim.now + CONFIG.unreachable_exclusion_seconds
    assert now.exclusions.nodes == (), "the nodes that could not reach it are not to blame"
    assert cut in now.morph.detail and now.restarts == 0
    end_generation(sim)
    assert cut not in sim.job().nodes and set(spokes) <= set(sim.job().nodes)
    assert held_out(sim.job(), cut, sim.now)
    assert not held_out(sim.job(), cut, sim.now + CONFIG.unreachable_exclusion_seconds), "only for a while"


def test_one_failed_start_leaves_the_node_out_and_a_second_partner_implicates_the_host_instead() -> None:
    sim = start(3)
    cut = host(sim)
    first = next(n for n in sim.job().nodes if n != cut)
    running(sim)
    cannot_start(sim, [first])  # one edge: which end is cut off cannot be told yet
    sim.step(1)
    assert sim.job().exclusions.nodes == (first,) and sim.job().morph.cause is MorphCause.TRAINER_START_FAILED
    assert not implicated(sim)
    end_generation(sim)
    assert host(sim) == cut and first not in sim.job().nodes
    second = next(n for n in sim.job().nodes if n != cut)
    running(sim)
    cannot_start(sim, [second])  # a second partner: the host is the one thing both failures share
    sim.step(1)
    (event,) = implicated(sim)
    assert event.node == cut and event.data["partners"] == sorted([first, second])
    assert sim.job().exclusions.nodes == (), f"{first} is taken back: its failure is explained"
    assert sim.job().morph.cause is MorphCause.PEER_UNREACHABLE
    end_generation(sim)
    assert set(sim.job().nodes) == {first, second}


def test_failed_starts_older_than_the_memory_implicate_nobody() -> None:
    record = replace(job(), exclusions=Exclusions(rendezvous_failures=(("node-2", "node-1", 0.0),)))
    old = judge(record, [("node-3", "node-1", 1000.0)], 1000.0, memory_seconds=900.0)
    assert dict(old.implicated) == {} and old.edges == (("node-3", "node-1", 1000.0),)
    recent = judge(record, [("node-3", "node-1", 500.0)], 500.0, memory_seconds=900.0)
    assert dict(recent.implicated) == {"node-1": ("node-2", "node-3")}
    assert recent.edges == () and recent.cleared == ("node-2", "node-3")


def test_a_spoke_that_failed_with_two_hosts_is_implicated_and_the_hosts_are_not() -> None:
    record = replace(job(), exclusions=Exclusions(("node-3",), (("node-3", "node-1", 10.0),)))
    verdict = judge(record, [("node-3", "node-2", 20.0)], 20.0, memory_seconds=900.0)
    assert dict(verdict.implicated) == {"node-3": ("node-1", "node-2")} and verdict.cleared == ("node-1", "node-2")
