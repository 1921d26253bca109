"""A checkpoint request from the controller: every rank writes one at the same next step boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.local.processes import port_range_base
from tests.runtime.helpers import TINY, wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.contract import ControlDir
from worker_agent.runtime.link.control import CheckpointRequests
from worker_agent.runtime.storage import checkpoint as ck

INTERVAL = 1000  # the job never gets there: every checkpoint in this test is a requested one


def test_the_first_counter_is_the_baseline_and_any_change_is_one_request(tmp_path: Path) -> None:
    control = ControlDir(tmp_path)
    control.request_checkpoint(5)
    rank0, rank1 = CheckpointRequests(control, 0), CheckpointRequests(control, 1)
    assert (rank0.contribution(), rank1.contribution()) == (5.0, 0.0), "only rank 0's counter is summed"
    agreed = [5.0, 5.0, 6.0, 6.0, 6.0, 9.0, 2.0]
    assert [rank0.requested(a) for a in agreed] == [False, False, True, False, False, True, True]
    assert [rank1.requested(a) for a in agreed] == [False, False, True, False, False, True, True]
    assert CheckpointRequests(None, 0).contribution() == 0.0


@pytest.mark.slow
def test_a_request_checkpoints_between_intervals_on_every_rank(tmp_path: Path, node_zygote: NodeZygote) -> None:
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=2, micro_batch_size=2, global_batch=6)
    root = tmp_path / "ckpt"
    job = JobSpec(
        name="requested",
        entrypoint=TINY,
        global_batch=6,
        dtype="float64",
        steps=100_000,
        checkpoint_interval=INTERVAL,
        checkpoint_dir=str(root),
        timeout_seconds=10.0,
    )
    launch = LaunchSpec(job, layout.to_dict(), f"127.0.0.1:{port_range_base(1)}", root)
    supervisor = Supervisor(tmp_path / "work", warm=1, zygote=True, inherited=node_zygote())  # a CPU node's
    keys = [TrainerKey("job-1", 1, rank) for rank in range(2)]
    try:
        supervisor.request_checkpoint("job-1", 1, 5)  # older than the generation: no checkpoint for it
        for key in keys:
            supervisor.start(key, launch)
        wait_for(lambda: all(r.step >= 4 for r in supervisor.reports()), 90, "four steps on both ranks")
        assert ck.step_dirs(root) == [], "a request published before the start is not a new one"

        written: list[int] = []
        for counter in (6, 7):
            before = supervisor.reports()[0].last_checkpoint_step or 0
            supervisor.request_checkpoint("job-1", 1, counter)

            def committed(after: int = before) -> bool:
                return (supervisor.reports()[0].last_checkpoint_step or 0) > after

            wait_for(committed, 60, f"the checkpoint of request {counter}")
            written.append(supervisor.reports()[0].last_checkpoint_step or 0)
        assert all(r.status.running for r in supervisor.reports()), [supervisor.log_tail(k) for k in keys]
    finally:
        supervisor.kill_all()
    first, second = written
    assert 4 <= first < second < INTERVAL
    assert [step for step, _ in ck.step_dirs(root)] == [second, first]
    for step in written:
        manifest = ck.verify(ck.step_dir(root, step, 1)).manifest  # the directory of generation 1
        assert manifest.step == step
        # The manifest is committed only when both ranks wrote their layers for this very step.
        assert sorted({f.writer_rank for f in manifest.files}) == [0, 1]
