"""The invariants every decided world keeps: each one caught when broken (the simulations check them all)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core.invariants import InvariantViolated, check, violations
from controller.core.lifecycle import Action, JobState, NodeState
from tests.controller.test_reconcile import started


def test_a_running_world_keeps_every_invariant() -> None:
    sim = started(4)
    assert violations(sim.world) == []


@pytest.mark.parametrize(
    ("breaking", "words"),
    [
        ("running-without-layout", "is RUNNING without a layout"),
        ("running-told-to-stop", "is RUNNING but its trainers are told STOP"),
        ("node-released", "which does not hold it"),
        ("ready-holds-job", "is READY but holds job j1"),
        ("unknown-job", "holds job ghost, which does not exist"),
        ("finished-holds-node", "still holds job j1, which is SUCCEEDED"),
    ],
)
def test_each_invariant_is_caught_when_broken(breaking: str, words: str) -> None:
    world = started(4).world
    job = world.jobs["j1"]
    name = job.nodes[0]
    nodes, jobs = dict(world.nodes), dict(world.jobs)
    if breaking == "running-without-layout":
        jobs["j1"] = replace(job, layout=None)
    elif breaking == "running-told-to-stop":
        jobs["j1"] = replace(job, action=Action.STOP)
    elif breaking == "node-released":
        nodes[name] = replace(nodes[name], state=NodeState.READY, job=None)
    elif breaking == "ready-holds-job":
        nodes[name] = replace(nodes[name], state=NodeState.READY)
    elif breaking == "unknown-job":
        nodes[name] = replace(nodes[name], job="ghost")
    else:
        jobs["j1"] = replace(job, state=JobState.SUCCEEDED)
    broken = replace(world, nodes=nodes, jobs=jobs)
    with pytest.raises(InvariantViolated, match=words):
        check(broken)


def test_a_step_may_not_take_a_generation_back_or_a_job_out_of_a_final_state() -> None:
    world = started(2).world
    job = world.jobs["j1"]
    back = replace(world, jobs={"j1": replace(job, generation=0)})
    assert any("generation went back from 1 to 0" in v for v in violations(back, world))
    done = replace(world, jobs={"j1": replace(job, state=JobState.CANCELLED)}, nodes={})
    again = replace(done, jobs={"j1": replace(job, state=JobState.QUEUED)})
    assert violations(again, done) == ["job j1 left CANCELLED for QUEUED"]
