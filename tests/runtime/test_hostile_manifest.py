"""A manifest is untrusted input: one that names files outside its step directory, links, another job's
files or identity, or is malformed, makes a damaged checkpoint. ``checkpoint verify`` says so with the
reason (exit 2 when it is named, a warning in a root) and resume falls back to the previous checkpoint;
nothing is read from outside the step directory and nothing raises anything but the damage error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from morphing.jobspec import identity_hash
from spotmorph.cli import main
from tests.runtime.helpers import train
from worker_agent.contract import CheckpointLoaded, CheckpointSkipped, events_of, read_progress
from worker_agent.runtime.storage import checkpoint as ck

LAYERS = ["embed", "block0", "block1", "head"]
JOB = {"entrypoint": "tiny_gpt.py:build_tiny", "global_batch": 7, "seed": 0, "dtype": "float64"}
OTHER_JOB = {**JOB, "seed": 1}
JOB_HASH = identity_hash(JOB)


def write_checkpoints(root: Path, steps: list[int], job: dict[str, Any] = JOB) -> None:
    """Checkpoints as the trainer commits them (one rank, every field of the manifest), without processes."""
    writer = ck.CheckpointWriter(root, 0, 1, "test", keep=len(steps), background=False, timeout=10)
    for step in steps:
        payloads = {
            layer: {
                "format": "spotmorph.layer/v1",
                "layer": layer,
                "tensors": {f"{layer}.weight": torch.full((4, 3), float(step + job["seed"]))},
                "optimizer": {f"{layer}.weight": {"step": torch.tensor(float(step))}},
            }
            for layer in LAYERS
        }
        manifest = {
            "data_cursor": {"samples_consumed": 7 * step, "epoch": 0, "offset": 7 * step},
            "job_hash": identity_hash(job),
            "job": job,
            "layout": {"pipeline_stages": 1, "data_parallel": 1},
            "generation": 0,
            "layer_names": LAYERS,
        }
        writer.save(step, payloads, manifest)


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints at steps 1, 2, 3 of JOB."""
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_checkpoints(root, [1, 2, 3])
    assert [ck.verify(p, JOB_HASH).step for _, p in ck.step_dirs(root)] == [3, 2, 1]
    return root


def _edit(step: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((step / ck.MANIFEST).read_text())
    change(manifest)
    (step / ck.MANIFEST).write_text(json.dumps(manifest))


def _borrow(entry: dict[str, Any], source: Path) -> None:
    """Point ``entry`` at ``source`` with its real size and checksum, so only the path can give it away."""
    entry["path"] = str(source)
    entry["bytes"] = source.stat().st_size
    entry["xxh3_128"] = xxhash.xxh3_128(source.read_bytes()).hexdigest()


def _dotdot(step: Path) -> None:
    def change(m: dict[str, Any]) -> None:
        _borrow(m["files"][0], step.parent / "step-00000002" / m["files"][0]["path"])
        m["files"][0]["path"] = "../step-00000002/" + Path(m["files"][0]["path"]).name

    _edit(step, change)


def _absolute(step: Path) -> None:
    _edit(step, lambda m: _borrow(m["files"][0], (step.parent / "step-00000002" / m["files"][0]["path"]).resolve()))


def _dev_zero(step: Path) -> None:
    _edit(step, lambda m: m["files"][0].update(path="/dev/zero"))


def _symlinked_file(step: Path) -> None:
    outside = step.parent.parent / "outside"
    outside.mkdir()
    shutil.move(step / "block0.pt", outside / "block0.pt")
    (step / "block0.pt").symlink_to(outside / "block0.pt")


def _symlink_to_dev_zero(step: Path) -> None:
    (step / "block0.pt").unlink()
    (step / "block0.pt").symlink_to("/dev/zero")


def _symlinked_step_dir(step: Path) -> None:
    elsewhere = step.parent.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.move(step, elsewhere / step.name)
    step.symlink_to(elsewhere / step.name)


def _other_jobs_files(step: Path) -> None:
    other = step.parent.parent / "other"
    write_checkpoints(other, [3], OTHER_JOB)

    def change(m: dict[str, Any]) -> None:
        for entry in m["files"]:
            _borrow(entry, other / step.name / entry["path"])
            entry["path"] = f"../../other/{step.name}/{Path(entry['path']).name}"

    _edit(step, change)


def _other_jobs_checkpoint(step: Path) -> None:
    other = step.parent.parent / "other"
    write_checkpoints(other, [3], OTHER_JOB)
    shutil.rmtree(step)
    shutil.copytree(other / step.name, step)


def _forged_job_hash(step: Path) -> None:
    _edit(step, lambda m: m.update(job_hash=identity_hash(OTHER_JOB)))


def _entry_without_bytes(step: Path) -> None:
    _edit(step, lambda m: m["files"][0].pop("bytes"))


def _integer_path(step: Path) -> None:
    _edit(step, lambda m: m["files"][0].update(path=7))


def _grown_to_a_terabyte(step: Path) -> None:
    """Sparse: no disk used, but a reader that reads before checking the size runs out of memory."""
    os.truncate(step / "head.pt", 1 << 40)


def _sha256_in_a_v3_manifest(step: Path) -> None:
    """A SHA-256 that matches the file, but format v3 lists XXH3-128: a mixed-up or hand-edited manifest."""

    def change(m: dict[str, Any]) -> None:
        entry = m["files"][0]
        del entry["xxh3_128"]
        entry["sha256"] = hashlib.sha256((step / entry["path"]).read_bytes()).hexdigest()

    _edit(step, change)


def _two_checksums(step: Path) -> None:
    _edit(step, lambda m: m["files"][0].update(sha256="0" * 64))


def _no_checksum(step: Path) -> None:
    _edit(step, lambda m: m["files"][0].pop("xxh3_128"))


def _named_pipe(step: Path) -> None:
    (step / "head.pt").unlink()
    os.mkfifo(step / "head.pt")


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "dotdot path": (_dotdot, "climbs out with '..'"),
    "absolute path": (_absolute, "is absolute"),
    "/dev/zero": (_dev_zero, "'/dev/zero' is absolute"),
    "symlinked file": (_symlinked_file, "block0.pt: is a symbolic link"),
    "symlink to /dev/zero": (_symlink_to_dev_zero, "block0.pt: is a symbolic link"),
    "symlinked step dir": (_symlinked_step_dir, "step-00000003: is a symbolic link to"),
    "another job's files": (_other_jobs_files, "climbs out with '..'"),
    "another job's checkpoint": (_other_jobs_checkpoint, "belongs to another job"),
    "forged job hash": (_forged_job_hash, "job_hash is not the hash of job"),
    "entry without bytes": (_entry_without_bytes, "files[0].bytes: Field required"),
    "integer path": (_integer_path, "files[0].path: Input should be a valid string"),
    "size mismatch": (_grown_to_a_terabyte, f"head.pt: {1 << 40} bytes, manifest says"),
    "named pipe": (_named_pipe, "head.pt: is not a regular file"),
    "SHA-256 in a v3 manifest": (_sha256_in_a_v3_manifest, "manifest gives every file's checksum as xxh3_128"),
    "two checksums": (_two_checksums, "must name exactly one checksum"),
    "no checksum": (_no_checksum, "must name exactly one checksum"),
}


@pytest.fixture
def root(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(pristine, copy)
    return copy


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_manifest_is_damage_and_resume_falls_back(root: Path, kind: str) -> None:
    damage, reason = HOSTILE[kind]
    damage(ck.step_dir(root, 3))
    with pytest.raises(ck.CheckpointError, match="step-00000003") as raised:
        ck.verify(ck.step_dir(root, 3), JOB_HASH)
    assert reason in str(raised.value)
    warnings: list[str] = []
    found = ck.newest_valid(root, JOB_HASH, warn=warnings.append)
    assert found is not None and found.step == 2
    assert len(warnings) == 1, warnings
    assert "skipping damaged checkpoint step-00000003" in warnings[0] and reason in warnings[0], warnings


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_verify_command_reports_hostile_manifest_as_damaged(
    capsys: pytest.CaptureFixture[str], root: Path, kind: str
) -> None:
    damage, reason = HOSTILE[kind]
    damage(ck.step_dir(root, 3))
    job = ["--job-hash", JOB_HASH]
    assert main(["checkpoint", "verify", str(ck.step_dir(root, 3)), *job]) == 2
    err = capsys.readouterr().err
    assert "step-00000003 is damaged" in err and reason in err and "Traceback" not in err, err
    assert main(["checkpoint", "verify", str(root), *job]) == 0
    out, err = capsys.readouterr()
    assert "valid, step 2" in out
    assert "skipping damaged checkpoint step-00000003" in err and reason in err, err


def test_another_jobs_checkpoint_is_refused_naming_both_jobs(root: Path) -> None:
    _other_jobs_checkpoint(ck.step_dir(root, 3))
    with pytest.raises(ck.ForeignCheckpoint) as raised:
        ck.verify(ck.step_dir(root, 3), JOB)
    message = str(raised.value)
    assert "seed=1" in message and "seed=0" in message
    assert identity_hash(OTHER_JOB)[:12] in message and identity_hash(JOB)[:12] in message


def test_a_root_holding_only_another_jobs_checkpoints_is_refused(root: Path) -> None:
    """Starting afresh there would write beside the other job's checkpoints and prune them."""
    from morphing.errors import UserInputError

    with pytest.raises(UserInputError, match="holds no checkpoint of this job"):
        ck.newest_valid(root, OTHER_JOB)
    with pytest.raises(UserInputError, match="belongs to another job"):
        ck.check_same_job(root, OTHER_JOB)
    ck.check_same_job(root, JOB)


def test_a_manifest_of_another_step_is_damage(root: Path) -> None:
    shutil.copy(ck.step_dir(root, 2) / ck.MANIFEST, ck.step_dir(root, 3) / ck.MANIFEST)
    with pytest.raises(ck.CheckpointError, match="manifest says step 2, not this directory's step"):
        ck.verify(ck.step_dir(root, 3))


def test_a_layer_file_that_is_no_layer_file_is_damage(root: Path) -> None:
    """A matching checksum shows only that manifest and file agree: the payload itself is checked too."""

    def change(m: dict[str, Any]) -> None:
        _borrow(m["files"][0], ck.step_dir(root, 3) / m["files"][0]["path"])
        m["files"][0]["path"] = Path(m["files"][0]["path"]).name

    (ck.step_dir(root, 3) / "block0.pt").write_bytes(b"not a torch file")
    _edit(ck.step_dir(root, 3), change)
    found = ck.verify(ck.step_dir(root, 3), JOB)
    with pytest.raises(ck.CheckpointError, match=r"block0\.pt: not a layer file"):
        ck.load_tensors(found, set(found.file_of_tensor()))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


def _mutate(node: Any, data: st.DataObject, depth: int = 0) -> Any:
    """``node`` with one value somewhere inside replaced, dropped or added."""
    children = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
    if children and depth < 6 and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(children))
        node[key] = _mutate(node[key], data, depth + 1)
        return node
    action = data.draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "drop" and children:
        del node[data.draw(st.sampled_from(children))]
        return node
    if action == "add" and isinstance(node, dict):
        node[data.draw(st.text(max_size=10))] = data.draw(JSON)
        return node
    return data.draw(JSON)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_arbitrarily_mutated_manifest_is_valid_or_damaged(pristine: Path, root: Path, data: st.DataObject) -> None:
    step = ck.step_dir(root, 3)
    original = (ck.step_dir(pristine, 3) / ck.MANIFEST).read_bytes()
    if data.draw(st.integers(0, 3)):
        text = json.dumps(_mutate(json.loads(original), data)).encode()
    else:
        raw = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at : at + data.draw(st.integers(0, 3))] = data.draw(st.binary(max_size=3))
        text = bytes(raw)
    (step / ck.MANIFEST).write_bytes(text)
    try:
        found = ck.verify(step, JOB)
        assert all(f.path == f"{f.layer}.pt" and (step / f.path).is_file() for f in found.manifest.files)
        ck.read_all(found)
    except ck.CheckpointError:
        pass
    ck.check_same_job(root, JOB)
    newest = ck.newest_valid(root, JOB)
    assert newest is not None and newest.step in (2, 3)


@pytest.mark.slow
def test_trainer_falls_back_past_a_malformed_manifest_and_says_so(tmp_path: Path) -> None:
    """Today's failure: the trainer aborted on the newest checkpoint's malformed manifest."""
    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    train(root, 1, 1, 3, "--checkpoint-interval=1")
    _entry_without_bytes(ck.step_dir(root, 3))
    result = train(root, 1, 1, 4, f"--run-dir={run_dir}")
    assert "skipping damaged checkpoint step-00000003: invalid manifest: files[0].bytes" in result.stderr
    assert "resuming from" in result.stderr and "step-00000002 (step 2)" in result.stderr, result.explain()
    progress = read_progress(run_dir / "progress-rank-0.jsonl")
    skipped = events_of(progress, CheckpointSkipped)
    assert len(skipped) == 1 and "step-00000003" in skipped[0].message and "bytes" in skipped[0].message
    assert [e.step for e in events_of(progress, CheckpointLoaded)] == [2]
    assert ck.verify(ck.step_dir(root, 4)).step == 4


def test_verify_prints_the_job_hash_it_accepts(capsys: pytest.CaptureFixture[str], pristine: Path) -> None:
    assert main(["checkpoint", "verify", str(pristine), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["job_hash"] == JOB_HASH and printed["job"] == JOB and printed["step"] == 3
    assert main(["checkpoint", "verify", str(pristine), "--job-hash", printed["job_hash"]]) == 0
    assert f"job_hash {JOB_HASH}" in capsys.readouterr().out
    assert main(["checkpoint", "verify", str(pristine), "--job-hash", JOB_HASH[:12]]) == 2
    assert "use the 64 hex digits" in capsys.readouterr().err
