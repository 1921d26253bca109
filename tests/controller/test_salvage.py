"""The unplanned-loss salvage, pure: a fake clock, the test plays the agents (reconcile.salvage).

A 2 x 2 job (stage s of replica d on node-(2d+s+1)) loses nodes without notice; its survivors report
the step they hold. The controller acts on the first report, suspects the nodes not heard from within
the grace, orders one writer per stage, and issues the next generation from the salvaged step well
before any heartbeat expiry, or falls back to the newest periodic checkpoint and says why. With
``morph_through_memory`` (the default) nothing is written: the survivors stop and keep the step, and the
next generation is told to take it from their memory.
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import MorphCause, SalvageOutcome
from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, NodeObservation, RankReport, RecordEvent, StartGeneration, World
from controller.core.reconcile import Config, assignment_for
from controller.core.records import CheckpointRef
from morphing.layout import make_layout
from tests.controller.helpers import job, node, planner
from tests.controller.test_reconcile import Sim

J, N = JobState, NodeState
CONFIG = Config(heartbeat_expiry_seconds=10, debounce_seconds=0, suspect_grace_seconds=1.5, salvage_write_seconds=30)
NODES = [f"node-{i}" for i in range(1, 5)]


def running(last_checkpoint: int = 30, steps_done: int = 41, memory: bool = False) -> Sim:
    layout = make_layout(
        num_layers=6,
        pipeline_stages=2,
        data_parallel=2,
        micro_batch_size=2,
        global_batch=8,
        nodes=[(n, 1) for n in NODES[:4]],
    )
    record = job(
        state=J.RUNNING,
        generation=1,
        layout=layout,
        step=steps_done,
        last_checkpoint=CheckpointRef(last_checkpoint),
        rendezvous="127.0.0.1:29501",
    )
    record = replace(record, spec=record.spec.model_copy(update={"morph_through_memory": memory}))
    nodes = {n: node(n, N.ASSIGNED, job="j1") for n in NODES}
    sim = Sim(World(nodes, {"j1": record}), CONFIG, now=100.0)
    for name in NODES:
        sim.beat(name, *ranks(sim, name, steps_done))
    sim.step()
    assert sim.job().state is J.RUNNING
    return sim


def ranks(sim: Sim, name: str, step: int, **fields: object) -> list[RankReport]:
    a = assignment_for(sim.world, name)
    if a is None:
        return []
    return [replace(RankReport("j1", a.generation, r, True, None, step, 30), **fields) for r in a.ranks]  # type: ignore[arg-type]


def holds(sim: Sim, name: str, held: int, step: int = 41) -> None:
    sim.beat(name, *ranks(sim, name, step, held_step=held))


def kinds(sim: Sim) -> list[str]:
    return [str(c.kind) for c in sim.log if isinstance(c, RecordEvent)]


def event(sim: Sim, kind: EventKind) -> RecordEvent:
    return next(c for c in sim.log if isinstance(c, RecordEvent) and c.kind is kind)


def test_a_killed_node_is_suspected_and_the_held_step_is_salvaged_before_any_expiry() -> None:
    sim = running()
    holds(sim, "node-1", 42)  # node-2 (replica 0, stage 1) was killed; node-1's collective failed first
    sim.step(0.1)
    j = sim.job()
    assert (j.state, j.action, j.morph.cause) == (J.MORPHING, Action.HOLD, MorphCause.COLLECTIVE_FAILED)
    first = event(sim, EventKind.COLLECTIVE_FAILED)
    assert (first.node, first.data["stage"], first.data["replica"], first.data["step"]) == ("node-1", 0, 0, 42)
    holds(sim, "node-3", 42)
    holds(sim, "node-4", 42)
    sim.step(0.5)
    assert sim.job().salvage.writers == ()  # node-2 may still speak within the grace
    sim.step(1.1)
    j = sim.job()
    assert j.salvage.suspected == ("node-2",) and "node-2" in j.exclusions.nodes
    assert (j.salvage.step, j.salvage.writers) == (42, (0, 3))  # stage 0 from replica 0, stage 1 from replica 1
    order = assignment_for(sim.world, "node-4")
    assert order is not None and order.action is Action.HOLD and order.salvage is not None
    assert (order.salvage.step, order.salvage.writers) == (42, (0, 3))
    # The first writer commits and exits; every survivor's trainer has exited.
    sim.beat("node-1", *ranks(sim, "node-1", 42, running=False, exit_code=0, last_checkpoint_step=42))
    sim.beat("node-3", *ranks(sim, "node-3", 42, running=False, exit_code=0))
    sim.beat("node-4", *ranks(sim, "node-4", 42, running=False, exit_code=0))
    sim.step(0.2)
    sim.step(0.2)
    j = sim.job()
    assert (j.state, j.generation, j.resume.step, j.steps_lost) == (J.RUNNING, 2, 42, 0)
    assert j.layout is not None and "node-2" not in j.layout.nodes()
    issued = next(c for c in sim.log if isinstance(c, StartGeneration))
    assert (issued.resume.step, issued.morph_cause) == (42, MorphCause.NODE_LOST)
    # The node that died is the cause; node-1, whose collective failed first, only noticed.
    assert issued.morph_detail.startswith("node-2 lost without notice; "), issued.morph_detail
    assert "noticed by node-1 (rank 0, stage 0, replica 0)" in issued.morph_detail, issued.morph_detail
    assert "node-2" in j.reason and j.reason.index("node-2") < j.reason.index("node-1"), j.reason
    assert event(sim, EventKind.SALVAGE_ENDED).data["reason"] == SalvageOutcome.COMMITTED
    order_of = [
        k
        for k in kinds(sim)
        if k
        in {
            "CollectiveFailed",
            "NodesSuspected",
            "SalvageOrdered",
            "CheckpointCommitted",
            "SalvageEnded",
            "GenerationIssued",
        }
    ]
    assert order_of == ["CollectiveFailed", "NodesSuspected", "SalvageOrdered", "CheckpointCommitted", "SalvageEnded"]
    assert sim.world.nodes["node-2"].state is not N.LOST  # all of it before the heartbeat expiry
    assert sim.job().restarts == 0  # a lost node is no trainer failure


def test_a_stage_that_lost_every_replica_falls_back_to_the_periodic_checkpoint_and_says_so() -> None:
    sim = running(last_checkpoint=30)
    holds(sim, "node-1", 42)  # node-2 and node-4 (both stage 1) were killed
    holds(sim, "node-3", 42)
    sim.step(0.1)
    sim.step(1.6)
    ended = event(sim, EventKind.SALVAGE_ENDED)
    assert ended.data["reason"] == SalvageOutcome.STAGE_LOST and ended.data["stages_lost"] == [1]
    assert ended.data["resume_step"] == 30
    j = sim.job()
    assert j.action is Action.ABORT and set(j.salvage.suspected) == {"node-2", "node-4"}
    sim.beat("node-1", *ranks(sim, "node-1", 42, running=False, exit_code=-9))
    sim.beat("node-3", *ranks(sim, "node-3", 42, running=False, exit_code=-9))
    sim.step(0.2)
    j = sim.job()
    assert (j.state, j.generation, j.resume.step, j.steps_lost) == (J.RUNNING, 2, 30, 12)


def test_a_writer_lost_during_the_write_falls_back_cleanly() -> None:
    sim = running(last_checkpoint=30)
    for name in ("node-1", "node-3", "node-4"):
        holds(sim, name, 42)
    sim.step(0.1)
    sim.step(1.6)
    assert sim.job().salvage.writers == (0, 3)
    for name in ("node-1", "node-3", "node-4"):  # the order reaches every node
        holds(sim, name, 42)
    sim.step(1.0)  # node-4 (the stage 1 writer) dies in the write: it beats no more
    assert sim.job().action is Action.HOLD
    sim.beat("node-1", *ranks(sim, "node-1", 42, held_step=42))
    sim.beat("node-3", *ranks(sim, "node-3", 42, held_step=42))
    sim.step(0.6)
    ended = event(sim, EventKind.SALVAGE_ENDED)
    assert ended.data["reason"] == SalvageOutcome.WRITER_FAILED and ended.data["nodes_gone"] == ["node-4"]
    j = sim.job()
    assert j.action is Action.ABORT and j.last_checkpoint.step == 30  # nothing of step 42 was committed
    assert "node-4" in j.salvage.suspected and "node-4" in j.exclusions.nodes
    assert event(sim, EventKind.NODES_SUSPECTED).data["nodes"] == ["node-2"]
    suspected = [c for c in sim.log if isinstance(c, RecordEvent) and c.kind is EventKind.NODES_SUSPECTED]
    assert [c.data["nodes"] for c in suspected] == [["node-2"], ["node-4"]]
    # The other survivors exit; g+1 is issued at once (no abort timeout, no heartbeat expiry), without node-4.
    sim.beat("node-1", *ranks(sim, "node-1", 42, running=False, exit_code=-9))
    sim.beat("node-3", *ranks(sim, "node-3", 42, running=False, exit_code=-9))
    sim.step(0.2)
    j = sim.job()
    assert (j.state, j.generation, j.resume.step) == (J.RUNNING, 2, 30)
    assert j.layout is not None and not {"node-2", "node-4"} & set(j.layout.nodes())
    assert sim.world.nodes["node-4"].state is not N.LOST


def test_a_failure_with_every_node_alive_counts_as_a_restart() -> None:
    sim = running()
    for name in ("node-1", "node-2", "node-3", "node-4"):
        holds(sim, name, 42)  # a step outlived the peer timeout: nobody is gone
    sim.step(0.1)
    j = sim.job()
    assert j.salvage.suspected == () and j.restarts == 1 and j.salvage.writers == (0, 1)


def test_a_held_step_already_checkpointed_needs_no_write() -> None:
    sim = running(last_checkpoint=42, steps_done=42)
    for name in ("node-1", "node-3", "node-4"):
        sim.beat(name, *ranks(sim, name, 42, held_step=42))
    sim.step(0.1)
    sim.step(1.6)
    assert event(sim, EventKind.SALVAGE_ENDED).data["reason"] == SalvageOutcome.ALREADY_COMMITTED
    assert sim.job().action is Action.ABORT


def test_an_observation_of_the_dead_node_before_the_failure_does_not_make_it_heard() -> None:
    sim = running()
    stale = sim.world.observed["node-2"]
    assert isinstance(stale, NodeObservation) and stale.last_seen < sim.now + 0.1
    holds(sim, "node-1", 42)
    sim.step(0.1)
    for name in ("node-3", "node-4"):
        holds(sim, name, 42)
    sim.step(1.6)
    assert sim.job().salvage.suspected == ("node-2",)


def test_with_morph_through_memory_the_survivors_keep_the_step_and_the_next_generation_takes_it() -> None:
    sim = running(memory=True)
    for name in ("node-1", "node-3", "node-4"):
        holds(sim, name, 42)  # node-2 was killed
    sim.step(0.1)
    sim.step(1.6)
    j = sim.job()
    assert (j.state, j.action, j.salvage.step, j.salvage.writers) == (J.MORPHING, Action.STOP, 42, ())
    assert j.salvage.suspected == ("node-2",)
    ended = event(sim, EventKind.SALVAGE_ENDED)
    assert (ended.data["reason"], ended.data["step"], ended.data["holders"]) == (
        SalvageOutcome.IN_MEMORY,
        42,
        [0, 2, 3],
    )
    assert EventKind.SALVAGE_ORDERED not in {c.kind for c in sim.log if isinstance(c, RecordEvent)}
    order = assignment_for(sim.world, "node-1")
    assert order is not None and order.action is Action.STOP and order.salvage is None  # stop, nobody writes
    for _ in range(3):  # node-2 goes LOST meanwhile (the survivors still beat): the stop goes on, it was suspected
        for name in ("node-1", "node-3", "node-4"):
            holds(sim, name, 42)
        sim.step(CONFIG.heartbeat_expiry_seconds / 2)
    assert sim.world.nodes["node-2"].state is N.LOST and sim.job().action is Action.STOP
    for name in ("node-1", "node-3", "node-4"):
        sim.beat(name, *ranks(sim, name, 42, running=False, exit_code=0, held_step=42))
    sim.step(0.2)
    sim.step(0.2)
    j = sim.job()
    assert (j.state, j.generation, j.resume.step, j.held) == (J.RUNNING, 2, 30, CheckpointRef(42, 1))
    assert j.steps_lost == 0 and j.layout is not None and "node-2" not in j.layout.nodes()
    issued = next(c for c in sim.log if isinstance(c, StartGeneration))
    assert (issued.held.step, issued.resume.step, issued.morph_cause) == (42, 30, MorphCause.NODE_LOST)


def test_a_kept_step_counts_the_steps_past_it_as_lost() -> None:
    sim = running(memory=True, steps_done=44)  # one rank reported step 44 before the others failed at 42
    for name in ("node-1", "node-3", "node-4"):
        holds(sim, name, 42, step=42)
    sim.step(0.1)
    sim.step(1.6)
    for name in ("node-1", "node-3", "node-4"):
        sim.beat(name, *ranks(sim, name, 42, running=False, exit_code=0, held_step=42))
    sim.step(0.2)
    sim.step(0.2)
    j = sim.job()
    assert (j.generation, j.held.step, j.steps_lost) == (2, 42, 2)


def test_a_suspected_node_gets_no_work_from_any_job_until_it_is_heard_from_again() -> None:
    """Issue 44: the pass that recorded NodesSuspected for node-2 admitted a queued job onto it; node-2 went LOST
    six seconds later. Now no job is given a node a salvage suspected, until that node is heard from again."""
    sim = running()
    sim.world = replace(sim.world, jobs={**sim.world.jobs, "j2": job("j2", J.QUEUED, at=100.0)})
    sim.planners["j2"] = planner()
    holds(sim, "node-1", 42)  # node-2 was killed; node-1's collective failed first
    sim.step(0.1)
    holds(sim, "node-3", 42)
    holds(sim, "node-4", 42)
    sim.step(0.5)
    sim.step(1.1)
    assert sim.job().salvage.suspected == ("node-2",) and sim.world.nodes["node-2"].suspected_at == sim.now
    for name in ("node-1", "node-3", "node-4"):
        sim.beat(name, *ranks(sim, name, 42, running=False, exit_code=0, last_checkpoint_step=42))
    for _ in range(4):
        sim.step(0.2)
    assert sim.job().generation == 2 and sim.world.nodes["node-2"].job is None  # released by j1 ...
    assert sim.world.jobs["j2"].state is J.QUEUED  # ... and given to no one
    for _ in range(3):
        sim.step(0.5)
    assert sim.world.jobs["j2"].state is J.QUEUED and sim.world.nodes["node-2"].suspected_at is not None
    sim.beat("node-2")  # it was alive after all: heard from after the suspicion
    sim.step(0.1)
    assert sim.world.nodes["node-2"].suspected_at is None
    # The scheduler grants j2 node-2 and one of j1's three (a second GPU adds far more to j2 than a third to j1):
    # j1 shrinks, and j2 starts once the node it gives up is free.
    assert sim.job().state is J.MORPHING and sim.job().morph.cause is MorphCause.SHRUNK
    kept = sim.job().morph.keep_only
    assert kept is not None and len(kept) == 2 and "node-2" not in kept
    for name in sim.job().nodes:
        sim.beat(name, *ranks(sim, name, 45, running=False, exit_code=0, last_checkpoint_step=42))
    sim.step(0.2)
    assert sim.world.nodes["node-2"].job == "j2" and sim.world.jobs["j2"].state is J.RUNNING
    assert set(sim.job().nodes) == set(kept) and sim.job().state is J.RUNNING
