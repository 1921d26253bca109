"""A generation that ends before it takes the step it was named from memory: its processes hold that step again
(worker_agent's TrainerProcess.next_generation), so the next generation is named it once more and no step is lost.
Stepped with the real planner; the processes' side runs in tests/agent/test_memory_chain.py."""

from __future__ import annotations

from dataclasses import replace

from controller.core.lifecycle import JobState
from controller.core.model import RankReport, StartGeneration
from controller.core.observations import Refusal
from controller.core.reconcile import assignment_for
from controller.core.reconcile.generation import held_for_next
from controller.core.records import CheckpointRef
from morphing.transfer import HeldSkipCause
from tests.controller.helpers import planner
from tests.controller.test_holders import evicted_sim
from tests.controller.test_reconcile import Sim


def generation_2_failed(sim: Sim, step: int = 41, refusal: Refusal | None = Refusal.PORT_TAKEN) -> None:
    """Generation 2's rank 0 exits (its rendezvous port taken, or a crash without ``refusal``) once every rank is at
    ``step``; the others exit once it aborts, as their agents end them."""
    for name in sim.job().nodes:
        a = assignment_for(sim.world, name)
        assert a is not None and a.generation == 2
        ranks = [
            RankReport("j1", 2, r, r != 0, 2 if r == 0 else None, step, 30, "taken" if r == 0 else "", refusal=refusal)
            for r in a.ranks
        ]
        sim.beat(name, *ranks)
    sim.step(1)
    assert sim.job().state is JobState.MORPHING and sim.job().generation == 2, sim.job().state
    sim.run_ranks("j1", running=False, step=step, ckpt=30, code=1)
    sim.step(1)


def issued(sim: Sim, generation: int) -> StartGeneration:
    [start] = [c for c in sim.log if isinstance(c, StartGeneration) and c.generation == generation]
    return start


def test_a_generation_that_failed_to_start_names_the_held_step_again_and_loses_none() -> None:
    sim = evicted_sim(4, 2, planner(4), "node-2")
    assert issued(sim, 2).held == CheckpointRef(41, 1)
    generation_2_failed(sim)
    job = sim.job()
    assert job.generation == 3 and job.state is JobState.RUNNING, (job.state, job.reason)
    start = issued(sim, 3)
    assert start.held == CheckpointRef(41, 1) and start.resume.step == 30  # held by generation 1, still
    assert job.held == CheckpointRef(41, 1) and job.step == 41 and job.steps_lost == 0


def test_a_generation_that_trained_past_its_held_step_does_not_name_it_again() -> None:
    sim = evicted_sim(4, 2, planner(4), "node-2")
    generation_2_failed(sim, step=44, refusal=None)  # a crash after three steps: nothing of 41 is held now
    start = issued(sim, 3)
    assert start.held == CheckpointRef() and start.resume.step == 30
    assert sim.job().steps_lost == 44 - 30


def test_the_next_generation_that_cannot_take_it_counts_the_steps_lost_then() -> None:
    sim = evicted_sim(4, 2, planner(4), "node-2")
    generation_2_failed(sim)
    assert sim.job().steps_lost == 0
    for name in sim.job().nodes:  # generation 3: nobody held it after all (the processes were killed meanwhile)
        a = assignment_for(sim.world, name)
        assert a is not None and a.generation == 3
        why, cause = "no trainer holds step 41 of generation 1", HeldSkipCause.NOT_HELD
        sim.beat(
            name,
            *(RankReport("j1", 3, r, True, None, 30, 30, held_skipped=why, held_skipped_cause=cause) for r in a.ranks),
        )
    sim.step(1)
    assert sim.job().steps_lost == 41 - 30 and sim.job().held == CheckpointRef()


def test_held_for_next_names_the_step_again_only_while_the_job_morphs_and_never_trained_past_it() -> None:
    sim = evicted_sim(4, 2, planner(4), "node-2")
    generation_2_failed(sim)
    job = sim.job()  # generation 3 running, named (41, 1), 30 committed
    morphing = replace(job, state=JobState.MORPHING)
    assert held_for_next(morphing, stopped=False) == CheckpointRef(41, 1)
    assert held_for_next(replace(job, state=JobState.QUEUED), stopped=False) == CheckpointRef(), "nodes let go"
    assert held_for_next(replace(morphing, step=42), stopped=False) == CheckpointRef(), "trained past it"
    committed = replace(morphing, last_checkpoint=CheckpointRef(41, 3))
    assert held_for_next(committed, stopped=False) == CheckpointRef(), "on the disk: nothing to take from memory"
    assert held_for_next(replace(morphing, step=44), stopped=True) == CheckpointRef(44, 3), "a stop: its own step"
    no_memory = replace(morphing, spec=morphing.spec.model_copy(update={"morph_through_memory": False}))
    assert held_for_next(no_memory, stopped=True) == CheckpointRef()
