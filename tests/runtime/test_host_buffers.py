"""Checkpoint host buffers are reused from one checkpoint to the next, never while a write may read them.

On a CPU nothing is pinned, but the pool's rules are the same as on a GPU, so they are tested here: a
released lease's buffers come back (the same tensors, so the same storages), an unreleased one's never do,
and a copy is a copy, never a view of the live tensor.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

from tests.runtime.helpers import TINY, probe, train
from worker_agent.runtime.storage import checkpoint as ck
from worker_agent.runtime.storage.checkpoint import CheckpointWriter, LayerPayload
from worker_agent.runtime.storage.fence import FENCE, Fence
from worker_agent.runtime.storage.host_buffers import HostLease, HostPool


def test_a_released_leases_buffers_are_reused_and_an_outstanding_ones_never_are() -> None:
    pool = HostPool()
    live = {"w": torch.ones(3, 4), "w/exp_avg": torch.zeros(3, 4), "b": torch.ones(4)}
    first = pool.lease()
    one = {n: first.copy(n, t) for n, t in live.items()}
    second = pool.lease()  # the first is still out (its write in flight): fresh buffers
    two = {n: second.copy(n, t) for n, t in live.items()}
    assert all(one[n].untyped_storage().data_ptr() != two[n].untyped_storage().data_ptr() for n in live)
    first.release()
    third = pool.lease()
    three = {n: third.copy(n, t) for n, t in live.items()}
    assert all(three[n] is one[n] for n in live)  # the released buffers, the very same storages
    assert (pool.allocated, pool.reused) == (6, 3)
    second.release()  # given back first: kept as the spare
    third.release()  # a spare is there already: dropped (the pool keeps at most one copy of the state)
    third.release()  # twice: nothing more
    fourth = pool.lease()
    assert fourth.copy("w", torch.ones(3, 4)) is two["w"]
    assert fourth.copy("w", torch.ones(3, 4)) is not one["w"]  # no second spare: a fresh buffer
    assert fourth.copy("w", torch.ones(4, 3)).shape == (4, 3)  # another shape is another buffer
    assert fourth.copy("w", torch.ones(3, 4, dtype=torch.float64)).dtype == torch.float64


def test_a_cpu_copy_is_a_copy_with_the_live_tensors_layout_never_a_view() -> None:
    pool = HostPool()
    live = torch.arange(12.0).view(3, 4).t()  # not contiguous
    lease = pool.lease()
    copy = lease.copy("w", live)
    assert torch.equal(copy, live) and copy.stride() == live.stride() and not copy.is_pinned()
    assert copy.untyped_storage().data_ptr() != live.untyped_storage().data_ptr()
    live.add_(1.0)
    assert torch.equal(copy, live - 1.0)  # the live tensor moved on; the copy did not
    lease.release()
    again = pool.lease().copy("w", live)
    assert again is copy and torch.equal(again, live)


class GatedWriter(CheckpointWriter):
    """A writer whose fence check waits for the test to let it through: a write held in flight, unread."""

    gate = threading.Semaphore(0)

    def check_fence(self) -> None:
        assert self.gate.acquire(timeout=30), "the test never let the fence check through"
        super().check_fence()


def test_a_copy_taken_while_a_background_write_is_in_flight_never_overwrites_what_it_writes(tmp_path: Path) -> None:
    """The writer's first fence check (before it serialises anything) waits until the test lets it through:
    step 1's write is in flight, unread, while step 2's copies are taken. (A named pipe in place of the fence
    did this once; the fence now refuses anything but a regular file.)"""
    root = tmp_path / "ckpt"
    root.mkdir()
    fence = Fence("job-1", 1)
    (root / FENCE).write_text(json.dumps({"job": fence.job, "generation": fence.generation}))

    def let_one_check_through() -> None:
        GatedWriter.gate.release()

    # Rank 1 of 2 writes its layers and its part file (rank 0 would commit the manifest).
    writer = GatedWriter(root, 1, 2, "run", keep=5, background=True, timeout=30, generation=1, fence=fence)
    pool = HostPool()
    live = torch.full((64, 64), 1.0)

    def payloads() -> tuple[torch.Tensor, dict[str, LayerPayload], HostLease]:
        lease = pool.lease()
        copy = lease.copy("layer.w", live)
        return copy, {"layer": {"format": "spotmorph.layer/v1", "layer": "layer", "tensors": {"w": copy}}}, lease

    w1, first, first_lease = payloads()
    writer.save(1, first, None, done=first_lease.release)
    live.fill_(2.0)  # step 2 trains on while step 1 is written
    w2, second, second_lease = payloads()
    assert w1.untyped_storage().data_ptr() != w2.untyped_storage().data_ptr()
    assert bool((w1 == 1.0).all()) and bool((w2 == 2.0).all())
    feeder = threading.Thread(target=let_one_check_through)
    feeder.start()
    writer.wait()
    feeder.join()
    writer.save(2, second, None, done=second_lease.release)
    feeder = threading.Thread(target=let_one_check_through)
    feeder.start()
    writer.wait()
    feeder.join()
    written = {
        step: torch.load(root / f"step-{step:08d}-g1" / "layer.pt", weights_only=True)["tensors"]["w"]
        for step in (1, 2)
    }
    assert bool((written[1] == 1.0).all()) and bool((written[2] == 2.0).all())
    w3, _, _ = payloads()  # both writes are over: the first buffer is handed out again
    assert w3 is w1


# A real 1x1 stage of ENTRY (argv 1) in this process (gloo, world of one), checkpoints to argv 2.
STAGE = """
import json, sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from worker_agent.runtime.pipeline.comm import Communicators, make_groups
from worker_agent.runtime.pipeline.engine import StageRunner
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.partition import PartitionedModel

entry, ckpt = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
torch.set_num_threads(1)
job = JobSpec(name="probe", entrypoint=entry, global_batch=4, steps=3, checkpoint_dir=ckpt, device="cpu")
model = PartitionedModel(build_spec(entry, job.seed))
model.to_dtype(torch.float32)
layout = make_layout(num_layers=len(model.layer_names), pipeline_stages=1, data_parallel=1, micro_batch_size=2,
                     global_batch=4)
groups = make_groups(layout, model, 0, torch.device("cpu"), 60.0, Communicators())
runner = StageRunner(job, layout, 0, model, groups)
"""

RUNNER_PROBE = (
    STAGE
    + """
tensors = lambda p: [t for l in p.values() for t in [*l["tensors"].values(),
                     *(v for s in l["optimizer"].values() for v in s.values() if isinstance(v, torch.Tensor))]]
runner.run_step(0)
lease = runner.host.lease()
one = runner.payloads(lease=lease)
first = [t.clone() for t in tensors(one)]
lease.release()
runner.run_step(1)
live = {n: p.detach().clone() for n, p in runner.params}
lease = runner.host.lease()
two = runner.payloads(lease=lease)
shared = [a is b for a, b in zip(tensors(one), tensors(two), strict=True)]
copied = [two_l["tensors"][n] for two_l in two.values() for n in two_l["tensors"]]
print(json.dumps({
    "tensors": len(shared),
    "all_reused": all(shared),
    "allocated": runner.host.allocated,
    "reused": runner.host.reused,
    "equal_live": all(torch.equal(two_l["tensors"][n], live[n]) for two_l in two.values() for n in two_l["tensors"]),
    "changed": any(not torch.equal(a, b) for a, b in zip(first, tensors(two), strict=True)),
    "not_views": all(t.untyped_storage().data_ptr() != dict(runner.params)[n].untyped_storage().data_ptr()
                     for two_l in two.values() for n, t in two_l["tensors"].items()),
}))
"""
)


def test_a_stage_runners_second_checkpoint_reuses_the_first_ones_buffers(tmp_path: Path) -> None:
    """A real 1x1 stage (gloo, one process): after the first checkpoint's lease is released, the second copies
    every parameter and optimizer-state tensor into the same buffers, and holds the new step's values."""
    found = probe(RUNNER_PROBE, TINY, str(tmp_path / "ckpt"))
    assert found["tensors"] > 0 and found["all_reused"], found
    assert found["allocated"] == found["tensors"] and found["reused"] == found["tensors"], found
    assert found["equal_live"] and found["changed"] and found["not_views"], found


def test_background_checkpoints_in_reused_buffers_equal_written_ones_step_by_step(tmp_path: Path) -> None:
    """``spotmorph train`` 2x1, a checkpoint after every step: written in the background from buffers reused
    at every checkpoint, each one equals the checkpoint a run writing in the foreground took at that step, and
    consecutive ones differ (no step's values stand in for another's)."""
    steps = 4
    background, foreground = tmp_path / "background", tmp_path / "foreground"
    flags = ("--checkpoint-interval=1", f"--keep={steps + 1}")
    train(background, 2, 1, steps, *flags, "--background-checkpoint")
    train(foreground, 2, 1, steps, *flags)
    previous = None
    for step in range(1, steps + 1):
        ours, theirs = ck.resolve(ck.step_dir(background, step)), ck.resolve(ck.step_dir(foreground, step))
        same = ck.diff(theirs, ours)
        assert same["missing"] == [] and same["tensors_compared"] > 10 and same["max_abs"] == 0.0, (step, same)
        if previous is not None:
            assert ck.diff(previous, ours)["max_abs"] > 0.0, step
        previous = ours


LIVE_PROBE = (
    STAGE
    + """
from worker_agent.runtime.storage import writer as writer_mod
from worker_agent.runtime.storage.checkpoint import CheckpointWriter

slow = writer_mod.write_layer_files
def slow_disk(*args, **kwargs):  # the files are read only after the next step's forward and backward ran
    time.sleep(1.0)
    return slow(*args, **kwargs)
writer_mod.write_layer_files = slow_disk
runner.run_step(0)
at_one = {n: p.detach().clone() for n, p in runner.params}
writer = CheckpointWriter(Path(ckpt), 0, 1, "run", 3, True, 60.0)
live = runner.payloads(share=True)
shares = all(t.data_ptr() == dict(runner.params)[n].data_ptr() for l in live.values() for n, t in l["tensors"].items())
writer.save(1, live, {"job_hash": "x", "job": {}, "layout": layout.to_dict(), "generation": 0,
                      "layer_names": model.layer_names, "data_cursor": {}}, background=True)
runner.before_update = writer.files_written
runner.run_step(1)
writer.wait()
files = sorted(writer_mod.step_dir(Path(ckpt), 1).glob("*.pt"))
written = {n: t for f in files for n, t in torch.load(f, weights_only=True)["tensors"].items()}
print(json.dumps({
    "shares": shares,
    "files": len(written),
    "written_is_step_one": all(torch.equal(written[n], at_one[n]) for n in at_one),
    "updated_after": any(not torch.equal(p, at_one[n]) for n, p in runner.params),
    "gate_cleared": runner.before_update is None,
}))
"""
)


def test_a_write_from_the_live_tensors_holds_the_step_it_was_taken_at(tmp_path: Path) -> None:
    """After a morph through memory the held step is written in the background straight from the live CPU
    tensors (no copy): the next step's forward and backward run beside the write, and its update waits until
    the write has read them. A disk slowed by a second shows it: the file holds step 1, the update came after."""
    found = probe(LIVE_PROBE, TINY, str(tmp_path / "ckpt"))
    assert found["shares"] and found["files"] > 0, found
    assert found["written_is_step_one"] and found["updated_after"] and found["gate_cleared"], found
