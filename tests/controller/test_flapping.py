"""A node whose link flaps: pure decisions walked with an injected clock, one heartbeat a second.

A LOST incarnation is told to register again; a node back soon after LOST waits in JOINING (longer with
each further flap) before it gets work, quarantined, with a ``NodeQuarantined`` event; one back after the flap
memory, or an agent that merely restarted, is not quarantined.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from controller.core import intake
from controller.core.events import EventKind
from controller.core.flapping import Damping
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Command, NodeObservation, RecordEvent, World, apply
from controller.core.reconcile import Config, reconcile
from tests.controller.helpers import job, planner

N = NodeState
CONFIG = Config(heartbeat_expiry_seconds=10.0, debounce_seconds=1.0, damping=Damping(10.0, 300.0, 600.0))
VM = intake.instance_of("vm-1", "10.0.0.1", None)


@dataclass
class Cluster:
    """The controller's world as it moves: registrations, heartbeats and reconcile passes at times we pick."""

    world: World = field(default_factory=lambda: World({}, {"j1": job("j1")}))
    now: float = 0.0
    events: list[RecordEvent] = field(default_factory=list)
    states: list[tuple[float, NodeState]] = field(default_factory=list)

    def apply(self, commands: list[Command]) -> None:
        self.world = apply(self.world, commands)
        self.events += [c for c in commands if isinstance(c, RecordEvent)]

    def register(self) -> None:
        self.apply(intake.register(self.world, "n", 1, "10.0.0.1", self.now, VM, damping=CONFIG.damping)[1])
        self.reconcile()

    def beat(self) -> None:
        """A heartbeat the controller receives (refused as its API would refuse it), then a reconcile."""
        node = self.world.nodes["n"]
        intake.check_incarnation(self.world, "n", node.incarnation)
        observed = {**self.world.observed, "n": NodeObservation(node.incarnation, self.now)}
        self.world = replace(self.world, observed=observed)
        self.reconcile()

    def reconcile(self) -> None:
        self.apply(reconcile(self.world, self.now, CONFIG, {"j1": planner()}))
        state = self.world.nodes["n"].state
        if not self.states or self.states[-1][1] is not state:
            self.states.append((self.now, state))

    def beats(self, until: float) -> None:
        while self.now + 1 <= until:
            self.now += 1
            self.beat()

    def silence(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now + 1 <= end:
            self.now += 1
            self.reconcile()

    @property
    def node(self) -> str:
        return str(self.world.nodes["n"].state)

    def quarantines(self) -> list[RecordEvent]:
        return [e for e in self.events if e.kind is EventKind.NODE_QUARANTINED]


def test_a_flapping_node_waits_longer_each_time_and_never_flips_on_each_lost_beat() -> None:
    c = Cluster()
    c.register()
    c.beats(3)
    assert c.world.nodes["n"].state is N.ASSIGNED  # the queued job was admitted onto it
    c.silence(11)
    assert c.node == "LOST"
    with pytest.raises(intake.Stale, match="register again"):
        c.beat()  # the link healed: the LOST incarnation is over, its agent kills its trainers and registers
    c.register()
    node = c.world.nodes["n"]
    assert (node.incarnation, node.state, node.flaps, node.quarantined_until) == (2, N.JOINING, 1, c.now + 10)
    said = c.quarantines()[-1].data
    assert said["quarantine_seconds"] == 10 and "quarantined in JOINING for 10 s" in str(said["message"])
    back = c.now
    c.beats(back + 9)
    assert c.node == "JOINING", "no work while it has not been stable for the quarantine"
    assert c.world.jobs["j1"].state is JobState.QUEUED
    c.beats(back + 10)
    assert c.node in ("READY", "ASSIGNED")
    moved = c.world.nodes["n"]
    assert moved.state_since == back + 10
    c.silence(11)
    assert c.node == "LOST"
    c.register()
    assert (c.world.nodes["n"].flaps, c.quarantines()[-1].data["quarantine_seconds"]) == (2, 20), (
        "the quarantine doubles"
    )
    c.silence(11)
    assert c.node == "GONE", "a quarantined node that goes silent is gone, as any joining node"
    transitions = [s for _, s in c.states]
    assert transitions.count(N.LOST) == 2


def test_a_node_back_after_the_memory_or_an_agent_restart_is_not_quarantined() -> None:
    c = Cluster()
    c.register()
    c.beats(3)
    c.silence(11)
    c.now += 700  # longer than the flap memory
    c.register()
    assert (c.world.nodes["n"].flaps, c.world.nodes["n"].quarantined_until) == (0, None) and not c.quarantines()
    c.beats(c.now + 2)
    assert c.node in ("READY", "ASSIGNED")

    flapped = Cluster()
    flapped.register()
    flapped.beats(3)
    flapped.silence(11)
    flapped.register()  # quarantined: flap 1
    flapped.beats(flapped.now + 15)
    flapped.register()  # the agent restarted on the same VM (it was never LOST in this incarnation)
    restarted = flapped.world.nodes["n"]
    assert (restarted.flaps, restarted.quarantined_until, len(flapped.quarantines())) == (1, None, 1)


def test_no_damping_when_the_quarantine_is_zero() -> None:
    world = World({}, {})
    world = apply(world, intake.register(world, "n", 1, "a", 0.0, VM, damping=Damping(0.0))[1])
    lost = replace(world.nodes["n"], state=N.LOST, lost_at=5.0)
    world = replace(world, nodes={"n": lost})
    again, commands = intake.register(world, "n", 1, "a", 6.0, VM, damping=Damping(0.0))
    assert again.quarantined_until is None and again.flaps == 1
    assert not [c for c in commands if isinstance(c, RecordEvent) and c.kind is EventKind.NODE_QUARANTINED]


def test_a_node_silent_during_its_quarantine_is_quarantined_again_longer_when_it_comes_back() -> None:
    c = Cluster()
    c.register()
    c.beats(3)
    c.silence(11)
    c.register()  # flap 1: quarantined for 10 s
    c.beats(c.now + 15)
    c.silence(11)
    c.register()  # flap 2: quarantined for 20 s
    c.silence(11)
    assert c.node == "GONE", "silent while quarantined: gone, as any joining node"
    c.register()
    node = c.world.nodes["n"]
    assert (node.state, node.flaps, node.quarantined_until) == (N.JOINING, 3, c.now + 40), "a further flap: longer"
    assert [e.data["quarantine_seconds"] for e in c.quarantines()] == [10, 20, 40]
    c.beats(c.now + 39)
    assert c.node == "JOINING"
    c.beats(c.now + 1)
    assert c.node in ("READY", "ASSIGNED")
