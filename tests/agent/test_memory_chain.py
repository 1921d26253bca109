"""A chain of morphs through memory on real trainer processes (the supervisor, gloo on loopback): 1 x 2, then
2 x 1, then 1 x 2 again, each generation taking the step the last one stopped at from its trainers' memory.
Its end equals an uninterrupted one-process run of the same job: within 1e-9 in float64, and bit for bit in
exact mode, where every layout's result is bitwise the one-process one whatever step the stops land on, so
the chain through memory is also bit for bit the same chain through the disk (tests/runtime/test_exact.py
runs exact chains through the disk)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import Layout, make_layout
from spotmorph.local.harness import max_rel_diff
from spotmorph.local.processes import port_range_base
from tests.agent.test_supervisor import loaded_by
from tests.runtime.helpers import TINY, wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.contract import CommittedCheckpoint, ExitCode

STEPS, BATCH, MICRO = 80, 6, 2


def layout(stages: int, replicas: int) -> Layout:
    return make_layout(
        num_layers=4, pipeline_stages=stages, data_parallel=replicas, micro_batch_size=MICRO, global_batch=BATCH
    )


def job(tmp_path: Path, exact: bool) -> JobSpec:
    return JobSpec(
        name="chain",
        entrypoint=TINY,
        global_batch=BATCH,
        seed=11,
        dtype="float32" if exact else "float64",
        exact=exact,
        micro_batch_size=MICRO if exact else None,
        steps=STEPS,
        checkpoint_interval=0,
        checkpoint_dir=str(tmp_path / "unused"),
        timeout_seconds=10.0,
    )


def generation_of(supervisor: Supervisor, generation: int) -> list[TrainerReport]:
    return [r for r in supervisor.reports() if r.status.key.generation == generation]


def stop_and_hold(supervisor: Supervisor, generation: int, width: int, start: int) -> int:
    """Once every rank of ``generation`` has stepped three times past ``start``, a planned stop that holds;
    returns the step it landed on."""

    def ranks() -> list[TrainerReport]:
        return generation_of(supervisor, generation)

    wait_for(lambda: len(ranks()) == width and all(r.step >= start + 3 for r in ranks()), 90, "three steps")
    supervisor.request_stop("job-1", generation)
    wait_for(lambda: not any(r.status.running for r in ranks()), 60, "a stop that holds")
    step = ranks()[0].step
    assert step < STEPS and all(r.status.exit_code == 0 and r.step == step for r in ranks()), ranks()
    return step


def run(supervisor: Supervisor, spec: JobSpec, chain: list[Layout], checkpoints: Path) -> list[int]:
    """Generations 1, 2, ... of job-1 in ``chain``'s layouts, each but the last stopped and held once it has
    stepped three times, the next taking that step from memory; the last runs to the end. Returns the steps
    the stops landed on."""
    held: CommittedCheckpoint | None = None
    stops: list[int] = []
    for generation, shape in enumerate(chain, start=1):
        rendezvous = f"127.0.0.1:{port_range_base(1) + 3 * generation}"
        launch = LaunchSpec(spec, shape.to_dict(), rendezvous, checkpoints, held=held)
        for rank in range(shape.world_size):
            supervisor.start(TrainerKey("job-1", generation, rank), launch)
        supervisor.forget({("job-1", generation)})
        if generation < len(chain):
            stops.append(stop_and_hold(supervisor, generation, shape.world_size, held.step if held else 0))
            held = CommittedCheckpoint(stops[-1], generation)
    last = len(chain)
    wait_for(lambda: not any(r.status.running for r in generation_of(supervisor, last)), 240, "the end")
    reports = generation_of(supervisor, last)
    assert reports and all(r.status.exit_code == 0 and r.step == STEPS for r in reports), reports
    return stops


def reference(tmp_path: Path, spec: JobSpec, node_zygote: NodeZygote) -> Path:
    """The job run uninterrupted by one process (1 x 1): where its checkpoints are."""
    supervisor = Supervisor(tmp_path / "reference-work", warm=1, zygote=True, inherited=node_zygote())
    try:
        run(supervisor, spec, [layout(1, 1)], tmp_path / "reference")
    finally:
        supervisor.kill_all()
    return tmp_path / "reference"


@pytest.mark.parametrize(  # exact mode's chain in make soak; make test: tests/runtime/test_exact.py
    "exact", [False, pytest.param(True, marks=pytest.mark.soak)], ids=["float64", "exact"]
)
@pytest.mark.slow
def test_a_chain_of_morphs_through_memory_ends_where_one_process_does(
    tmp_path: Path, exact: bool, node_zygote: NodeZygote
) -> None:
    spec = job(tmp_path, exact)
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())  # a CPU node's
    try:
        stops = run(supervisor, spec, [layout(1, 2), layout(2, 1), layout(1, 2)], tmp_path / "chain")
        for generation, step in enumerate(stops, start=2):
            loaded = loaded_by(supervisor, generation)
            memory = f"memory of generation {generation - 1}"
            assert [(e.step, e.checkpoint) for e in loaded] == [(step, memory)] * 2, loaded
    finally:
        supervisor.kill_all()
    difference = max_rel_diff(reference(tmp_path, spec, node_zygote), tmp_path / "chain")
    assert difference == 0.0 if exact else difference <= 1e-9, (stops, difference)


def start_generation(
    supervisor: Supervisor, spec: JobSpec, generation: int, shape: Layout, port: int, **more: object
) -> None:
    launch = LaunchSpec(spec, shape.to_dict(), f"127.0.0.1:{port}", more.pop("checkpoints"), **more)  # type: ignore[arg-type]
    for rank in range(shape.world_size):
        supervisor.start(TrainerKey("job-1", generation, rank), launch)
    supervisor.forget({("job-1", generation)})


@pytest.mark.slow
def test_a_generation_that_never_met_leaves_the_held_step_to_the_next(tmp_path: Path, node_zygote: NodeZygote) -> None:
    """Generation 1 (1 x 2) stops at S and holds it. Generation 2 (2 x 1) is named S, but its rank 0 cannot bind the
    rendezvous port (another process holds it) and rank 1 waits for a store that never comes; the agent ends it.
    Both processes hold S again (exit 2 and 1, not killed), and generation 3 (1 x 2) takes S from their memory and
    ends where one uninterrupted process does. Before, both processes exited with the step, and generation 3 could
    only start over from the disk (here: from scratch, nothing was written)."""
    spec, checkpoints, base = job(tmp_path, exact=False), tmp_path / "chain", port_range_base(1)
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())  # a CPU node's
    try:
        start_generation(supervisor, spec, 1, layout(1, 2), base + 3, checkpoints=checkpoints)
        held = CommittedCheckpoint(stop_and_hold(supervisor, 1, 2, 0), 1)
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", base + 6))  # bound, not listening: rank 0 cannot bind, rank 1 finds no store
            start_generation(supervisor, spec, 2, layout(2, 1), base + 6, checkpoints=checkpoints, held=held)
            wait_for(lambda: generation_of(supervisor, 2)[0].status.exit_code is not None, 90, "rank 0's refusal")
            rank_1 = TrainerKey("job-1", 2, 1)

            def ended() -> bool:
                return not supervisor.end(rank_1, may_hold=True) and not generation_of(supervisor, 2)[1].status.running

            wait_for(ended, 30, "rank 1 ended by its agent")
        ends = {r.status.key.rank: r.status.exit_code for r in generation_of(supervisor, 2)}
        assert ends == {0: ExitCode.USER_ERROR, 1: ExitCode.ABORTED}, ends  # neither was killed (-9)
        assert "holds again" in supervisor.log_tail(rank_1), supervisor.log_tail(rank_1)
        start_generation(supervisor, spec, 3, layout(1, 2), base + 9, checkpoints=checkpoints, held=held)
        wait_for(lambda: not any(r.status.running for r in generation_of(supervisor, 3)), 240, "the end")
        assert all(r.status.exit_code == 0 and r.step == STEPS for r in generation_of(supervisor, 3))
        loaded = [(e.step, e.checkpoint) for e in loaded_by(supervisor, 3)]
        assert loaded == [(held.step, "memory of generation 1")] * 2, loaded
    finally:
        supervisor.kill_all()
    assert max_rel_diff(reference(tmp_path, spec, node_zygote), checkpoints) <= 1e-9
