"""Trainers that refuse their input (exit 2): the job fails at once on the user's mistake, a node that cannot
run it is left out, anything else is restarted as before (pure core, a fake clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.api.wire import job_to_pb, rank_from_pb
from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import IllegalTransition, JobState
from controller.core.model import Action, RankReport, RecordEvent, StartGeneration
from controller.core.observations import Refusal
from controller.core.reconcile import Config, assignment_for
from controller.core.reconcile.generation import rendezvous_port
from controller.persistence.codec import job_from_dict, job_to_dict
from tests.controller.helpers import from_old_row, job, version_9_row
from tests.controller.test_reconcile import CONFIG, Sim, cluster, started
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.wire import trainer_status_to_pb
from worker_agent.contract import FailureKind

J = JobState
NO_DATA = "dataset has 3 samples, fewer than global_batch=8; use a larger dataset or a smaller global_batch"
NO_CUDA = "device cuda was asked for, but torch.cuda.is_available() is false here; use device cpu"


def exits(sim: Sim, name: str, code: int, error: str = "", refusal: Refusal | None = None) -> None:
    """Every rank of ``name`` in the current generation exited before its first step."""
    a = assignment_for(sim.world, name)
    assert a is not None
    ranks = [RankReport("j1", a.generation, r, False, code, 0, 0, error, refusal=refusal) for r in a.ranks]
    sim.beat(name, *ranks)


def generations(sim: Sim) -> list[int]:
    return [c.generation for c in sim.log if isinstance(c, StartGeneration)]


def test_a_user_error_fails_the_job_at_once_with_its_message_and_no_restart() -> None:
    sim = started(4)
    sim.run_ranks("j1")  # the others still wait at the rendezvous
    first = sim.job().nodes[1]
    rank = assignment_for(sim.world, first).ranks[0]  # type: ignore[union-attr]
    exits(sim, first, 2, NO_DATA + "\n", Refusal.USER_INPUT)
    sim.step(1)
    failed = sim.job()
    assert failed.state is J.FAILED and failed.failure_cause is JobFailureCause.USER_ERROR
    assert failed.reason == f"{NO_DATA} (rank {rank} on {first})"
    assert failed.restarts == 0 and failed.exclusions.nodes == () and generations(sim) == [1]
    assert all(n.job is None for n in sim.world.nodes.values()), "its nodes are free for other jobs"


def test_a_crash_or_an_exit_2_without_the_trainers_word_takes_the_old_path() -> None:
    for code, refusal in ((1, None), (2, None)):
        sim = started(2)
        for attempt in range(4):
            sim.run_ranks("j1", running=False, code=code, step=3)
            sim.step()
            if attempt < 3:
                assert sim.job().state is J.RUNNING and sim.job().restarts == attempt + 1
                assert sim.job().morph.cause is MorphCause.TRAINER_FAILED and sim.job().failure_cause is None
        assert sim.job().state is J.FAILED and sim.job().failure_cause is JobFailureCause.TRAINERS_FAILED
        assert sim.job().reason.startswith("2 trainer(s) failed; max_restarts=3"), refusal


def test_a_node_that_cannot_run_the_job_is_left_out_and_the_job_replans_on_the_others() -> None:
    sim = started(4)
    first = sim.job()
    sim.run_ranks("j1")
    unfit = first.nodes[1]  # not the rendezvous host: its failure must not read as an unreachable host
    exits(sim, unfit, 2, NO_CUDA, Refusal.NODE_UNFIT)
    sim.step(1)
    now = sim.job()
    assert now.state is J.MORPHING and now.action is Action.ABORT
    assert now.morph.cause is MorphCause.TRAINER_START_FAILED and NO_CUDA in now.morph.detail
    assert now.exclusions.nodes == (unfit,) and now.exclusions.rendezvous_failures == ()
    assert now.restarts == first.restarts, "a node's lack is not the job's fault"
    events = [c for c in sim.log if isinstance(c, RecordEvent) and c.kind == "TrainerStartFailed"]
    assert [(c.node, c.data["error"]) for c in events] == [(unfit, NO_CUDA)]
    sim.beat(unfit, *sim.world.observed[unfit].ranks)  # every node heard from since the morph began
    for name in first.nodes:
        if name != unfit:
            exits(sim, name, 1)  # aborted
    sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().generation == 2 and unfit not in sim.job().nodes


def test_when_every_node_of_the_generation_cannot_run_it_the_job_fails_naming_them() -> None:
    sim = Sim(cluster(2, job()))
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    nodes = sim.job().nodes
    assert len(nodes) == 2
    for name in nodes:
        exits(sim, name, 2, NO_CUDA, Refusal.NODE_UNFIT)
    sim.step(1)
    failed = sim.job()
    assert failed.state is J.FAILED and failed.failure_cause is JobFailureCause.USER_ERROR
    assert failed.reason == f"no node of generation 1 can run it ({', '.join(sorted(nodes))}): {NO_CUDA}"
    assert failed.restarts == 0 and generations(sim) == [1]


def test_the_input_error_wins_over_a_node_s_lack_and_a_failed_job_always_has_a_cause() -> None:
    sim = started(2)
    a, b = sim.job().nodes
    exits(sim, a, 2, NO_CUDA, Refusal.NODE_UNFIT)
    exits(sim, b, 2, NO_DATA, Refusal.USER_INPUT)
    sim.step(1)
    assert sim.job().state is J.FAILED and sim.job().reason.startswith(NO_DATA)
    with pytest.raises(IllegalTransition, match="failure_cause"):
        from controller.core.changes import move

        move(started(1).job(), J.FAILED, "no cause", 0.0)


def test_the_cause_is_stored_and_shown_and_old_rows_have_none() -> None:
    failed = replace(job(), state=J.FAILED, reason=NO_DATA, failure_cause=JobFailureCause.USER_ERROR)
    assert job_from_dict(job_to_dict(failed)) == failed
    old = version_9_row(job())
    del old["failure_cause"]
    assert from_old_row(old).failure_cause is None
    assert job_to_pb(failed).failure_cause == "user_error" and job_to_pb(job()).failure_cause == ""


@pytest.mark.parametrize(
    ("code", "kind", "refusal"),
    [
        (2, "input", Refusal.USER_INPUT),
        (2, "node", Refusal.NODE_UNFIT),
        (2, "port_taken", Refusal.PORT_TAKEN),
        (2, None, None),
        (1, "abort", None),
    ],
)
def test_the_agent_carries_the_trainers_class_of_its_exit_to_the_controller(
    code: int, kind: FailureKind | None, refusal: Refusal | None
) -> None:
    status = TrainerStatus(TrainerKey("j1", 3, 1), running=False, exit_code=code)
    sent = trainer_status_to_pb(TrainerReport(status, pid=7, error=NO_CUDA, failure=kind))
    seen = rank_from_pb(sent, sent.error)
    assert (seen.exit_code, seen.refusal, seen.error) == (code, refusal, NO_CUDA)


TAKEN = "the rendezvous port 10.0.0.1:29533 is taken on this node: Address already in use"


def colliding() -> Config:
    """A salted config of two ports whose draws for generations 1 and 2 of ``j1`` are the same port."""
    for i in range(1000):
        config = replace(CONFIG, rendezvous_salt=f"salt-{i}", rendezvous_port_span=2)
        if rendezvous_port(config, "j1", 1) == rendezvous_port(config, "j1", 2):
            return config
    raise AssertionError("no colliding salt among 1000")


def test_a_taken_rendezvous_port_restarts_the_generation_on_another_port_uncounted() -> None:
    """Issue 44: a process that listened on a generation's port first made the job FAILED. Nobody's mistake:
    the generation ends and the next meets on another port, on the same nodes, ``restarts`` unchanged. Another
    even where the salted draw gives generation 2 generation 1's port (``colliding``)."""
    sim = Sim(cluster(2, job()), colliding())
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    first = sim.job()
    host = first.nodes[0]
    exits(sim, host, 2, TAKEN, Refusal.PORT_TAKEN)
    sim.step(1)
    now = sim.job()
    assert now.state is J.MORPHING and now.action is Action.ABORT and TAKEN in now.morph.detail
    assert now.restarts == first.restarts and now.exclusions.nodes == ()
    sim.beat(host, *sim.world.observed[host].ranks)  # every node heard from since the morph began
    for name in first.nodes:
        if name != host:
            exits(sim, name, 1)  # aborted
    sim.step(1)
    second = sim.job()
    assert second.state is J.RUNNING and second.generation == 2 and set(second.nodes) == set(first.nodes)
    assert second.rendezvous != first.rendezvous and second.restarts == first.restarts


def test_rendezvous_ports_follow_the_generation_and_the_controllers_salt() -> None:
    plain = Config()
    salted = replace(plain, rendezvous_salt="a" * 64)
    ports = {rendezvous_port(salted, "job-1", g) for g in range(1, 40)}
    assert len(ports) > 30 and all(plain.rendezvous_port_base <= p < 30000 for p in ports)
    assert [rendezvous_port(salted, "job-1", g) for g in range(1, 6)] != [
        rendezvous_port(plain, "job-1", g) for g in range(1, 6)
    ]  # not the formula anyone could compute
    other = replace(plain, rendezvous_salt="b" * 64)
    assert [rendezvous_port(salted, "job-1", g) for g in range(1, 6)] != [
        rendezvous_port(other, "job-1", g) for g in range(1, 6)
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=64), st.integers(1, 5000), st.integers(1, 8), st.sampled_from(["127.0.0.1", "[::1]"])
)
def test_a_generation_never_meets_on_the_port_of_the_one_before(
    salt: str, generation: int, span: int, host: str
) -> None:
    """Survivors of generation g may still listen on its port (holding for a salvage) when g+1's rank 0 binds: on a
    CI run the salted draw gave both the same port (1 in 500), and g+1 failed to start. Spans as small as 1 too."""
    config = replace(Config(), rendezvous_salt=salt, rendezvous_port_span=span)
    before = rendezvous_port(config, "job-1", generation)
    drawn = rendezvous_port(config, "job-1", generation + 1)
    now = rendezvous_port(config, "job-1", generation + 1, f"{host}:{before}")
    base = config.rendezvous_port_base
    assert base <= now < base + span
    assert now != before or span == 1
    assert now == drawn or drawn == before, "the draw stands unless it is the port before"
