"""Checkpoints named by generation, the fence, and loading exactly the committed checkpoint.

A generation the controller moved past can never make a checkpoint loadable, nor delete the checkpoints of
the generation that replaced it: these tests drive the real writer on a real directory, and real processes
racing to raise one fence.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from morphing.errors import UserInputError
from morphing.jobspec import identity_hash
from tests.runtime.helpers import as_sha256_format
from worker_agent.runtime.errors import FenceError, GenerationFenced
from worker_agent.runtime.storage import checkpoint as ck
from worker_agent.runtime.storage.fence import FENCE, Fence, check_fence, raise_fence, read_fence
from worker_agent.runtime.storage.manifest import dir_name

JOB = {"entrypoint": "m.py:build", "global_batch": 4, "seed": 1, "dtype": "float64"}


def _manifest(generation: int) -> dict[str, Any]:
    return {
        "data_cursor": {"samples_consumed": 0, "epoch": 0, "offset": 0},
        "job_hash": identity_hash(JOB),
        "job": JOB,
        "layout": {},
        "generation": generation,
        "layer_names": ["w"],
    }


def _payload(value: float) -> dict[str, Any]:
    return {"w": {"tensors": {"w.weight": torch.full((2,), value)}, "optimizer": {}}}


def writer(
    root: Path, generation: int, *, fenced: bool = True, keep: int = 3, resumed_from: int = 0
) -> ck.CheckpointWriter:
    fence = Fence("job-1", generation) if fenced else None
    if fence is not None:
        raise_fence(root, fence)
    return ck.CheckpointWriter(
        root, 0, 1, f"run{generation}", keep, False, 5.0, generation=generation, fence=fence, resumed_from=resumed_from
    )


def save(w: ck.CheckpointWriter, step: int) -> None:
    w.save(step, _payload(float(step)), _manifest(w.generation))


def committed_dirs(root: Path) -> list[str]:
    return sorted(p.name for _, _, p in ck.checkpoint_dirs(root) if (p / ck.MANIFEST).exists())


def test_two_generations_never_write_the_same_directory(tmp_path: Path) -> None:
    old, new = writer(tmp_path, 1, fenced=False), writer(tmp_path, 2, fenced=False)
    save(old, 20)
    save(new, 20)
    assert committed_dirs(tmp_path) == ["step-00000020-g1", "step-00000020-g2"]
    for generation in (1, 2):
        manifest = ck.verify(ck.step_dir(tmp_path, 20, generation), JOB).manifest
        assert (manifest.format, manifest.generation) == (ck.FORMAT, generation)
    assert ck.newest_valid(tmp_path, JOB).path.name == "step-00000020-g2"  # type: ignore[union-attr]


def test_a_fenced_generation_commits_nothing_and_removes_its_unfinished_directory(tmp_path: Path) -> None:
    stale = writer(tmp_path, 1)
    save(stale, 10)
    raise_fence(tmp_path, Fence("job-1", 2))  # generation 2 starts: before it loads anything
    with pytest.raises(GenerationFenced, match="generation 1 of job-1 is fenced off: a newer generation"):
        save(stale, 20)
    assert committed_dirs(tmp_path) == ["step-00000010-g1"]
    assert not ck.step_dir(tmp_path, 20, 1).exists()


class RaisedWhileWriting(ck.CheckpointWriter):
    """A newer generation raises the fence after this writer's part files and before its manifest."""

    def _commit(self, step: int, directory: Path, parts: Path, manifest: dict[str, Any]) -> None:
        raise_fence(self.root, Fence("job-1", self.generation + 1))
        super()._commit(step, directory, parts, manifest)


def test_the_fence_is_checked_right_before_the_manifest_rename(tmp_path: Path) -> None:
    raise_fence(tmp_path, Fence("job-1", 1))
    stale = RaisedWhileWriting(tmp_path, 0, 1, "r", 3, False, 5.0, generation=1, fence=Fence("job-1", 1))
    with pytest.raises(GenerationFenced):
        save(stale, 10)
    assert committed_dirs(tmp_path) == []
    assert not ck.step_dir(tmp_path, 10, 1).exists(), "the fenced generation removed its unfinished directory"


class OvertakenWhileWriting(ck.CheckpointWriter):
    """A newer generation starts, commits and prunes while this writer waits for its peers' parts."""

    def _commit(self, step: int, directory: Path, parts: Path, manifest: dict[str, Any]) -> None:
        save(writer(self.root, self.generation + 1, resumed_from=0), step + 10)
        super()._commit(step, directory, parts, manifest)


def test_a_write_whose_files_a_newer_generation_removed_is_reported_fenced_not_as_a_disk_error(
    tmp_path: Path,
) -> None:
    raise_fence(tmp_path, Fence("job-1", 1))
    stale = OvertakenWhileWriting(tmp_path, 0, 1, "r", 3, False, 0.1, generation=1, fence=Fence("job-1", 1))
    with pytest.raises(GenerationFenced, match="generation 1 of job-1 is fenced off"):
        save(stale, 10)
    assert committed_dirs(tmp_path) == ["step-00000020-g2"]


def test_a_stale_generation_never_prunes_a_newer_generations_checkpoints(tmp_path: Path) -> None:
    new = writer(tmp_path, 1, keep=1)
    save(new, 10)
    newer = writer(tmp_path, 2, keep=1, resumed_from=10)
    save(newer, 20)
    save(newer, 30)
    # The stale writer never got the fence back; even without a fence check, its pruning skips generation 2.
    unfenced_stale = ck.CheckpointWriter(tmp_path, 0, 1, "x", 1, False, 5.0, generation=1)
    save(unfenced_stale, 40)
    assert "step-00000030-g2" in committed_dirs(tmp_path)


def test_the_next_generation_drops_what_fenced_generations_wrote_past_its_checkpoint(tmp_path: Path) -> None:
    first = writer(tmp_path, 1)
    for step in (10, 20, 30):
        save(first, step)  # 30: written while partitioned, never committed by the controller
    second = writer(tmp_path, 2, resumed_from=20)
    save(second, 40)
    assert committed_dirs(tmp_path) == ["step-00000010-g1", "step-00000020-g1", "step-00000040-g2"]


def test_the_fence_only_goes_up_and_another_job_takes_the_directory_over(tmp_path: Path) -> None:
    assert read_fence(tmp_path) is None
    raise_fence(tmp_path, Fence("job-1", 3))
    with pytest.raises(GenerationFenced):
        raise_fence(tmp_path, Fence("job-1", 2))
    assert read_fence(tmp_path) == Fence("job-1", 3)
    raise_fence(tmp_path, Fence("job-1", 3))  # every rank of a generation raises it: idempotent
    raise_fence(tmp_path, Fence("job-2", 1))
    with pytest.raises(GenerationFenced, match="another job"):
        check_fence(tmp_path, Fence("job-1", 3))


def test_a_damaged_or_missing_fence_refuses_the_writer(tmp_path: Path) -> None:
    w = writer(tmp_path, 1)
    (tmp_path / FENCE).write_text("{not json")
    with pytest.raises(FenceError, match="is damaged"):
        save(w, 10)
    (tmp_path / FENCE).unlink()
    with pytest.raises(GenerationFenced, match="is gone now"):
        save(w, 10)
    assert committed_dirs(tmp_path) == []


def _raise(root: str, generation: int) -> None:
    with contextlib.suppress(GenerationFenced):
        raise_fence(Path(root), Fence("job-1", generation))


@pytest.mark.slow
def test_processes_racing_to_raise_the_fence_leave_the_highest(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    generations = list(range(1, 25))
    with context.Pool(4) as pool:
        pool.starmap(_raise, [(str(tmp_path), g) for g in reversed(generations)])
    assert read_fence(tmp_path) == Fence("job-1", max(generations))


def test_exactly_the_committed_checkpoint_loads_and_nothing_else(tmp_path: Path) -> None:
    save(writer(tmp_path, 1), 20)
    save(writer(tmp_path, 2, resumed_from=20), 30)
    assert ck.committed(tmp_path, 20, 1, JOB).path.name == "step-00000020-g1"
    with pytest.raises(UserInputError, match=r"step 20 of generation 2\) is not in .*step-00000020-g2 is missing"):
        ck.committed(tmp_path, 20, 2, JOB)
    (ck.step_dir(tmp_path, 30, 2) / "w.pt").write_bytes(b"damaged")
    with pytest.raises(UserInputError, match="step 30 of generation 2\\) is damaged"):
        ck.committed(tmp_path, 30, 2, JOB)


def test_a_manifest_moved_under_another_generations_name_is_refused(tmp_path: Path) -> None:
    save(writer(tmp_path, 1, fenced=False), 20)
    shutil.move(ck.step_dir(tmp_path, 20, 1), ck.step_dir(tmp_path, 20, 3))
    with pytest.raises(ck.CheckpointError, match="manifest says generation 1, not this directory's generation 3"):
        ck.verify(ck.step_dir(tmp_path, 20, 3), JOB)


def _as_v1(directory: Path, generation: int) -> None:
    as_sha256_format(directory, ck.FORMAT_V1)
    path = directory / ck.MANIFEST
    manifest = json.loads(path.read_text())
    manifest.update(generation=generation)
    path.write_text(json.dumps(manifest))


def test_a_v1_checkpoint_still_loads_and_is_the_committed_one_of_its_generation(tmp_path: Path) -> None:
    """Before v2 a controller generation wrote step-NNNNNNNN with its generation in the manifest."""
    save(writer(tmp_path, 0, fenced=False), 20)
    _as_v1(ck.step_dir(tmp_path, 20), 4)
    assert ck.newest_valid(tmp_path, JOB).step == 20  # type: ignore[union-attr]
    assert ck.committed(tmp_path, 20, 4, JOB).path.name == "step-00000020"
    assert ck.committed(tmp_path, 20, 0, JOB).path.name == "step-00000020"  # a controller before v2 sends 0
    with pytest.raises(UserInputError, match="is not in"):
        ck.committed(tmp_path, 20, 5, JOB)  # another generation's: never this one


def test_a_v2_manifest_of_a_named_generation_in_a_v1_directory_is_refused(tmp_path: Path) -> None:
    save(writer(tmp_path, 2, fenced=False), 20)
    shutil.move(ck.step_dir(tmp_path, 20, 2), ck.step_dir(tmp_path, 20))
    with pytest.raises(ck.CheckpointError, match="generation 2, not this directory's generation 0"):
        ck.verify(ck.step_dir(tmp_path, 20), JOB)


def test_a_generation_cut_off_from_the_controller_keeps_the_checkpoint_it_last_had_acknowledged(
    tmp_path: Path,
) -> None:
    """The controller acknowledged step 20; what follows goes unheard, so 20 is what the next generation loads."""
    raise_fence(tmp_path, Fence("job-1", 1))
    acknowledged = [0]
    w = ck.CheckpointWriter(
        tmp_path, 0, 1, "r", 1, False, 5.0, generation=1, fence=Fence("job-1", 1), acknowledged=lambda: acknowledged[0]
    )
    save(w, 10)
    acknowledged[0] = 10
    save(w, 20)
    acknowledged[0] = 20
    save(w, 30)
    assert committed_dirs(tmp_path) == ["step-00000020-g1", "step-00000030-g1"], "keep=1, and the acknowledged one"
    for step in (40, 50):  # cut off: nothing more is acknowledged
        save(w, step)
    assert committed_dirs(tmp_path) == [f"step-000000{s}-g1" for s in (20, 30, 40, 50)]
    acknowledged[0] = 50
    save(w, 60)
    assert committed_dirs(tmp_path) == ["step-00000050-g1", "step-00000060-g1"]


def test_a_rank_holding_for_a_salvage_gives_up_once_a_newer_generation_raised_the_fence(tmp_path: Path) -> None:
    from worker_agent.contract import ControlDir
    from worker_agent.runtime.morph import salvage

    root = tmp_path / "ckpt"
    ours = Fence("job-1", 1)
    raise_fence(root, ours)
    control = ControlDir(tmp_path / "control")
    control.path.mkdir()
    assert salvage.wait_for_order(control, 0.2, lambda: salvage._fenced_off(root, ours)) is None  # no order yet
    raise_fence(root, Fence("job-1", 2))
    why = salvage.wait_for_order(control, 30, lambda: salvage._fenced_off(root, ours))
    assert isinstance(why, str) and "fenced off" in why and "generation 2" in why


def test_pruning_never_deletes_another_jobs_checkpoints(tmp_path: Path) -> None:
    """Issue 44: ``keep`` deleted every older checkpoint in the directory, another job's too (the controller now
    refuses such a directory at submit; a job started by hand may still be pointed at one)."""
    other = {**_manifest(1), "job_hash": "0" * 64, "job": {**JOB, "seed": 99}}
    stranger = ck.CheckpointWriter(tmp_path, 0, 1, "other", 5, False, 5.0, generation=1)
    stranger.save(5, _payload(5.0), other)
    (tmp_path / dir_name(6, 1)).mkdir()
    (tmp_path / dir_name(6, 1) / ck.MANIFEST).write_text("not json")  # unreadable: not provably this job's
    mine = ck.CheckpointWriter(tmp_path, 0, 1, "mine", 1, False, 5.0, generation=2, job_hash=identity_hash(JOB))
    for step in (10, 20, 30):
        save(mine, step)
    assert committed_dirs(tmp_path) == ["step-00000005-g1", "step-00000006-g1", "step-00000030-g2"]
