"""The salvage from peer snapshots, pure: a 3 x 1 job (stage s on node-(s+1)) loses a node without notice.

Its survivors hold their live step and the peer snapshots they keep (morphing.snapshots: a ring, stage s's copy on
the next node). The controller takes the newest step every stage has among them, says so (``SalvageEnded``:
source snapshot, steps lost) and the next generation takes the lost stage from the survivor that kept its copy.
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import SalvageOutcome
from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, RankReport, StartGeneration, World
from controller.core.reconcile import assignment_for
from controller.core.records import CheckpointRef
from morphing.layout import make_layout
from tests.controller.helpers import job, node
from tests.controller.test_reconcile import Sim
from tests.controller.test_salvage import CONFIG, event

J, N = JobState, NodeState
NODES = ["node-1", "node-2", "node-3"]


def running(interval: int = 1) -> Sim:
    layout = make_layout(
        num_layers=6,
        pipeline_stages=3,
        data_parallel=1,
        micro_batch_size=2,
        global_batch=8,
        nodes=[(n, 1) for n in NODES],
    )
    record = job(state=J.RUNNING, generation=1, layout=layout, step=42, last_checkpoint=CheckpointRef(30))
    record = replace(record, spec=record.spec.model_copy(update={"snapshot_interval": interval}))
    sim = Sim(World({n: node(n, N.ASSIGNED, job="j1") for n in NODES}, {"j1": record}), CONFIG, now=100.0)
    for name in NODES:
        sim.beat(name, *ranks(sim, name))
    sim.step()
    return sim


def ranks(sim: Sim, name: str, **fields: object) -> list[RankReport]:
    a = assignment_for(sim.world, name)
    assert a is not None
    return [replace(RankReport("j1", a.generation, r, True, None, 42, 30), **fields) for r in a.ranks]  # type: ignore[arg-type]


def lose_node_3(sim: Sim, received_by_node_1: tuple[int, ...]) -> None:
    """node-3 (stage 2) is killed; node-1 (rank 0) kept stage 2's copies it received whole."""
    sim.beat(
        "node-1",
        *ranks(sim, "node-1", held_step=42, snapshot_own_steps=(41, 42), snapshot_received_steps=received_by_node_1),
    )
    sim.beat(
        "node-2", *ranks(sim, "node-2", held_step=42, snapshot_own_steps=(41, 42), snapshot_received_steps=(41, 42))
    )
    sim.step(0.1)
    sim.step(1.6)


def test_a_lost_stage_comes_back_from_its_snapshot_and_nothing_is_lost() -> None:
    sim = running()
    lose_node_3(sim, (41, 42))
    ended = event(sim, EventKind.SALVAGE_ENDED).data
    assert (ended["reason"], ended["step"], ended["source"], ended["steps_lost"]) == (
        SalvageOutcome.IN_MEMORY,
        42,
        "snapshot",
        0,
    )
    j = sim.job()
    assert (j.action, j.salvage.step, j.salvage.suspected) == (Action.STOP, 42, ("node-3",))
    for name in ("node-1", "node-2"):
        sim.beat(name, *ranks(sim, name, running=False, exit_code=0, held_step=42))
    sim.step(0.2)
    sim.step(0.2)
    j = sim.job()
    assert (j.state, j.generation, j.held, j.steps_lost) == (J.RUNNING, 2, CheckpointRef(42, 1), 0)
    assert j.layout is not None and set(j.layout.nodes()) == {"node-1", "node-2"}, "node-1 keeps stage 2's copy"
    issued = next(c for c in sim.log if isinstance(c, StartGeneration))
    assert (issued.held.step, issued.resume.step) == (42, 30)


def test_a_kill_in_the_middle_of_a_stream_takes_the_committed_snapshot_one_step_back() -> None:
    sim = running()
    lose_node_3(sim, (41,))
    ended = event(sim, EventKind.SALVAGE_ENDED).data
    assert (ended["step"], ended["source"], ended["steps_lost"]) == (41, "snapshot", 1)
    assert sim.job().salvage.step == 41


def test_without_snapshots_the_stage_is_lost_and_the_checkpoint_says_how_much() -> None:
    sim = running(interval=0)
    lose_node_3(sim, ())
    ended = event(sim, EventKind.SALVAGE_ENDED).data
    assert (ended["reason"], ended["source"], ended["steps_lost"], ended["resume_step"]) == (
        SalvageOutcome.STAGE_LOST,
        "checkpoint",
        12,
        30,
    )
    assert sim.job().action is Action.ABORT
