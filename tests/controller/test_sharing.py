"""Spot GPUs shared among live jobs by the scheduler's grants (controller.core.reconcile.sharing), stepped by
reconcile with a fake clock: a higher-priority job shrinks a running one and runs on what it gives up, a job that
waited the starvation bound is served by stopping one that ran long enough (its step written, then queued), and
a running job never grows onto a node granted to another."""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.events import EventKind
from controller.core.lifecycle import JobState
from controller.core.model import Action, JobRecord, RecordEvent, SetJob, World
from controller.core.reconcile import assignment_for
from controller.core.reconcile.config import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.sharing import owners
from scheduler.allocation import ShareConfig
from scheduler.jobs import Grant
from scheduler.policy import Decision, SchedulerConfig
from scheduler.pools import PoolKind
from tests.controller.helpers import job, node
from tests.controller.test_reconcile import CONFIG, Sim

J = JobState


def needing(job_id: str, min_gpus: int, priority: int = 0, at: float = 0.0) -> JobRecord:
    record = job(job_id, priority=priority, at=at)
    return replace(record, spec=record.spec.model_copy(update={"min_gpus": min_gpus}))


def cluster(nodes: int, *jobs: JobRecord, config: Config = CONFIG) -> Sim:
    world = World({f"node-{i}": node(f"node-{i}", at=-1.0 + i * 0.001) for i in range(1, nodes + 1)}, {})
    sim = Sim(replace(world, jobs={j.id: j for j in jobs}), config)
    for name in sim.world.nodes:
        sim.beat(name)
    return sim


def submit(sim: Sim, record: JobRecord) -> None:
    sim.world = replace(sim.world, jobs={**sim.world.jobs, record.id: record})
    sim.planners[record.id] = next(iter(sim.planners.values()))


def stop_done(sim: Sim, job_id: str, step: int, checkpoint: int = 0) -> None:
    """Every rank of the job's generation reports it stopped at ``step`` (exit 0)."""
    sim.run_ranks(job_id, running=False, step=step, ckpt=checkpoint, code=0)


def train(sim: Sim, seconds: float, *job_ids: str) -> None:
    """``seconds`` pass in 5 s passes, every running job's ranks reporting a step further each pass and every free
    node beating (within the heartbeat expiry)."""
    for _ in range(int(seconds // 5)):
        for name, record in sim.world.nodes.items():
            if record.job is None:
                sim.beat(name)
        for job_id in job_ids:
            if sim.job(job_id).state is J.RUNNING:
                sim.run_ranks(job_id, step=sim.job(job_id).step + 1)
        sim.step(5)


def events(sim: Sim, kind: EventKind) -> list[RecordEvent]:
    return [c for c in sim.log if isinstance(c, RecordEvent) and c.kind is kind]


def test_a_higher_priority_job_shrinks_a_running_one_and_runs_on_what_it_gives_up() -> None:
    sim = cluster(4, job("low"))
    sim.step()
    assert sim.job("low").state is J.RUNNING and len(sim.job("low").nodes) == 4
    submit(sim, job("high", priority=3, at=sim.now))
    sim.step(1)
    low = sim.job("low")
    assert low.state is J.MORPHING and low.action is Action.STOP and low.morph.cause is MorphCause.SHRUNK
    assert low.morph.keep_only is not None and 0 < len(low.morph.keep_only) < 4
    # nothing is written at the stop: the nodes given up leave, handing the layers only they hold to the nodes kept
    assert low.checkpoint_request == 0
    for name in low.nodes:  # the nodes leaving start the stop, saying they leave; the others stop with them
        told = assignment_for(sim.world, name)
        leaving = name not in low.morph.keep_only
        assert told is not None and told.action is Action.STOP, (name, told)
        assert (told.leaving, told.await_leavers) == (leaving, not leaving), (name, low.morph.keep_only)
    shrunk = events(sim, EventKind.JOB_SHRUNK)
    assert len(shrunk) == 1 and shrunk[0].data["for_job"] == "high" and shrunk[0].data["cause"] == "priority"
    given = set(shrunk[0].data["given_up"])
    assert sim.job("high").state is J.QUEUED and "to be freed" in sim.job("high").reason
    assert "low shrinking for it" in sim.job("high").reason
    stop_done(sim, "low", step=7)
    sim.step(1)
    assert sim.job("low").state is J.RUNNING and set(sim.job("low").nodes) == set(low.morph.keep_only)
    assert sim.job("low").morph.keep_only is None  # the shrink is done: the next morph may take free nodes again
    assert sim.job("high").state is J.RUNNING and set(sim.job("high").nodes) == given
    assert sim.job("low").held.step == 7  # the step it stopped at comes from memory, as for any planned stop


def test_equal_jobs_never_shrink_each_other_for_nothing() -> None:
    sim = cluster(2, job("a"), job("b", at=0.5))
    sim.step()
    assert sim.job("a").state is J.RUNNING and sim.job("b").state is J.RUNNING  # one node each: worth most
    train(sim, 300, "a", "b")
    assert not events(sim, EventKind.JOB_SHRUNK)
    assert sim.job("a").generation == 1 and sim.job("b").generation == 1


def test_a_job_that_waited_the_starvation_bound_is_served_by_stopping_one_that_ran_long_enough() -> None:
    share = ShareConfig(aging_seconds=1e9, starvation_seconds=100.0, min_run_seconds=50.0)
    config = replace(CONFIG, scheduler=SchedulerConfig(share=share))
    sim = cluster(2, needing("first", 2), config=config)
    sim.step()
    assert sim.job("first").state is J.RUNNING
    submit(sim, needing("starved", 2, at=sim.now + 0.5))
    sim.step(1)
    assert sim.job("starved").state is J.QUEUED and sim.job("first").state is J.RUNNING
    train(sim, 95, "first")
    assert sim.job("first").state is J.RUNNING, "not before the starvation bound"
    request = sim.job("first").checkpoint_request
    train(sim, 10, "first")  # starved has waited over 100 s; first ran over 50 s
    first = sim.job("first")
    assert first.state is J.MORPHING and first.morph.cause is MorphCause.SHRUNK and first.morph.keep_only == ()
    assert first.checkpoint_request == request + 1  # its step is written before it queues
    assert events(sim, EventKind.JOB_SHRUNK)[-1].data["cause"] == "starvation"
    stop_done(sim, "first", step=first.step, checkpoint=first.step)
    sim.step(1)
    said = [c.job.reason for c in sim.log if isinstance(c, SetJob) and c.job.id == "first" and c.change]
    assert sim.job("first").state is J.QUEUED and any(r.startswith("shrunk to no GPUs") for r in said)
    assert sim.job("first").last_checkpoint.step == first.step  # nothing lost: it resumes from there
    assert sim.job("starved").state is J.RUNNING and len(sim.job("starved").nodes) == 2


def test_a_running_job_never_grows_onto_a_node_granted_to_another() -> None:
    sim = cluster(2, needing("wide", 2))
    sim.step()
    assert sim.job("wide").state is J.RUNNING
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-3": node("node-3", at=sim.now)})
    submit(sim, job("small", at=sim.now))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step(1)
    assert sim.job("small").state is J.RUNNING and sim.job("small").nodes == ("node-3",)
    assert sim.job("wide").state is J.RUNNING and "node-3" not in sim.job("wide").nodes


def test_a_node_granted_in_part_to_two_jobs_goes_whole_to_the_one_granted_most_then_to_its_holder() -> None:
    nodes = {"n1": node("n1", slots=4), "n2": replace(node("n2", slots=4), job="b")}
    draft = Draft(World(nodes, {}), 0.0)
    spot = PoolKind.SPOT
    most = Decision((Grant("a", "n1", spot, 1), Grant("b", "n1", spot, 3)), (), (), ())
    assert owners(most, draft) == {"n1": "b"}
    tie = Decision((Grant("a", "n2", spot, 2), Grant("b", "n2", spot, 2)), (), (), ())
    assert owners(tie, draft) == {"n2": "b"}, "a tie goes to the job that holds the node: no morph for nothing"
    free_tie = Decision((Grant("b", "n1", spot, 2), Grant("a", "n1", spot, 2)), (), (), ())
    assert owners(free_tie, draft) == {"n1": "a"}, "and on a free node to the first job by name"
