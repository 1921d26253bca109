"""Checkpoint I/O without whole-file copies: a layer is serialised straight into its file and hashed on the
way (several files at once), and read back in bounded chunks into a sealed private copy that
``torch.load`` maps. The bytes on disk and the manifest entries are what they always were; what was loaded
is exactly what was verified, whatever happens to the file afterwards. Real files throughout."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from morphing.jobspec import identity_hash
from tests.runtime.helpers import REPO, as_sha256_format
from worker_agent.runtime.errors import CheckpointWriteFailed
from worker_agent.runtime.storage import checkpoint as ck
from worker_agent.runtime.storage import durable, streams
from worker_agent.runtime.storage import manifest as manifest_mod
from worker_agent.runtime.storage import writer as writer_mod
from worker_agent.runtime.storage.durable import atomic_write_stream

JOB = {"entrypoint": "m.py:build", "global_batch": 4, "seed": 1, "dtype": "float32"}
BIG = 4 << 20  # float32 elements of the big layer: 16 MB of parameter, 48 MB with its optimizer state


def _payloads(big: int = 1024) -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    out = {}
    for layer, numel in (("embed", big), ("block0", 300), ("block1", 500), ("head", 7)):
        weight = torch.randn(numel)
        out[layer] = {
            "format": "spotmorph.layer/v1",
            "layer": layer,
            "tensors": {f"{layer}.w": weight},
            "optimizer": {
                f"{layer}.w": {
                    "step": torch.tensor(3.0),
                    "exp_avg": torch.randn(numel),
                    "exp_avg_sq": torch.rand(numel),
                }
            },
        }
    return out


def _write(root: Path, payloads: dict[str, dict[str, Any]]) -> ck.Checkpoint:
    manifest = {
        "data_cursor": {"samples_consumed": 0, "epoch": 0, "offset": 0},
        "job_hash": identity_hash(JOB),
        "job": JOB,
        "layout": {},
        "generation": 0,
        "layer_names": list(payloads),
    }
    ck.CheckpointWriter(root, 0, 1, "test", keep=2, background=False, timeout=10).save(1, payloads, manifest)
    return ck.resolve(root)


def _equal(loaded: dict[str, Any], payload: dict[str, Any]) -> bool:
    return all(torch.equal(loaded["tensors"][n], t) for n, t in payload["tensors"].items()) and all(
        torch.equal(loaded["optimizer"][n][k], v) for n, s in payload["optimizer"].items() for k, v in s.items()
    )


def test_layer_files_hold_the_bytes_and_entries_they_always_had_and_no_temp_file(tmp_path: Path) -> None:
    payloads = _payloads()
    found = _write(tmp_path, payloads)
    manifest = json.loads((found.path / ck.MANIFEST).read_text())
    assert [e["path"] for e in manifest["files"]] == sorted(f"{layer}.pt" for layer in payloads)
    for entry in manifest["files"]:
        data = ck.serialise(payloads[entry["layer"]])  # torch.save into memory, as the writer once did
        assert (found.path / entry["path"]).read_bytes() == data
        assert entry["bytes"] == len(data) and entry["xxh3_128"] == xxhash.xxh3_128(data).hexdigest()
        assert entry["tensors"] == [f"{entry['layer']}.w"] and entry["writer_rank"] == 0
    assert sorted(p.name for p in found.path.iterdir()) == sorted([*(f"{layer}.pt" for layer in payloads), ck.MANIFEST])
    loaded = ck.load_tensors(found, set(found.file_of_tensor()))
    assert all(_equal(loaded[f"{layer}.pt"], payload) for layer, payload in payloads.items())


def test_no_whole_layer_file_is_held_in_python_memory_on_the_way_to_or_from_the_disk(tmp_path: Path) -> None:
    """Python's allocator sees what a BytesIO or a bytearray of the file would take: a 48 MB layer file
    passes through buffers of a megabyte or two each way (tensors live in torch's allocator)."""
    payloads = _payloads(BIG)
    found = _write(tmp_path / "first", payloads)
    directory = tmp_path / "layers"
    directory.mkdir()
    tracemalloc.start()
    try:
        entries = writer_mod.write_layer_files(directory, payloads, 0)
        _, written_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loaded = ck.load_tensors(found, set(found.file_of_tensor()))
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [e["path"] for e in entries] == [f"{layer}.pt" for layer in payloads]  # in the order of the payloads
    files = found.manifest.files
    manifest = {e.path: e.model_dump(by_alias=True, exclude_none=True) | {"tensors": list(e.tensors)} for e in files}
    assert entries == [manifest[e["path"]] for e in entries]  # the same bytes, written again
    assert (found.path / "embed.pt").stat().st_size > 40e6
    assert written_peak < 8e6 and read_peak < 8e6, (written_peak, read_peak)
    assert _equal(loaded["embed.pt"], payloads["embed"])


def test_what_was_loaded_does_not_change_when_the_file_does(tmp_path: Path) -> None:
    """The tensors are views of a sealed private copy of the verified bytes: the file overwritten in place
    or truncated afterwards changes nothing (and touching them never faults on a vanished page)."""
    payloads = _payloads(1 << 16)
    found = _write(tmp_path, payloads)
    loaded = ck.load_tensors(found, set(found.file_of_tensor()))
    path = found.path / "embed.pt"
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.write(b"\xff" * size)
    assert _equal(loaded["embed.pt"], payloads["embed"])
    os.truncate(path, 0)
    assert _equal(loaded["embed.pt"], payloads["embed"])
    loaded["embed.pt"]["tensors"]["embed.w"].add_(1.0)  # still the trainer's to change: a private mapping
    assert torch.equal(loaded["embed.pt"]["tensors"]["embed.w"], payloads["embed"]["tensors"]["embed.w"] + 1.0)


@pytest.mark.skipif(not streams.can_seal(), reason="sealed memfds are Linux's")
def test_the_copy_a_layer_is_loaded_from_cannot_be_changed(tmp_path: Path) -> None:
    found = _write(tmp_path, _payloads())
    entry = found.manifest.files[0]
    with manifest_mod.verified_copy(found.path, entry) as copy:
        assert isinstance(copy, str)
        fd = os.open(copy, os.O_RDWR)
        try:
            for change in (lambda: os.write(fd, b"x"), lambda: os.ftruncate(fd, 0), lambda: os.ftruncate(fd, 1 << 30)):
                with pytest.raises(PermissionError):
                    change()
        finally:
            os.close(fd)
        assert xxhash.xxh3_128(Path(copy).read_bytes()).hexdigest() == entry.xxh3_128


def test_without_a_memfd_a_layer_loads_from_a_verified_copy_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = _payloads()
    found = _write(tmp_path, payloads)
    monkeypatch.setattr(streams, "can_seal", lambda: False)
    loaded = ck.load_tensors(found, set(found.file_of_tensor()))
    assert all(_equal(loaded[f"{layer}.pt"], payload) for layer, payload in payloads.items())
    _flip_a_byte(found.path / "head.pt")
    with pytest.raises(ck.CheckpointError, match=r"step-00000001/head\.pt: checksum \(XXH3-128\) does not match"):
        ck.load_tensors(found, {"head.w"})


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_file_changed_after_verification_is_refused_when_loaded(tmp_path: Path) -> None:
    found = _write(tmp_path, _payloads())
    _flip_a_byte(found.path / "block1.pt")
    with pytest.raises(ck.CheckpointError, match=r"step-00000001/block1\.pt: checksum \(XXH3-128\) does not"):
        ck.load_tensors(found, {"block1.w"})
    with pytest.raises(ck.CheckpointError, match=r"block1\.pt: checksum \(XXH3-128\) does not match the manifest"):
        ck.verify(found.path)


@pytest.mark.parametrize("told", [2999, 3001])
def test_a_file_of_another_size_than_it_had_is_damage_and_never_read_past_it(tmp_path: Path, told: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3000)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ck.CheckpointError, match="f: changed size while being read") as raised:
            streams.hash_read(fd, told, "f")
    finally:
        os.close(fd)
    read = min(3000, told + 1)  # one byte past the size it was told shows the file grew, and no more
    assert str(raised.value) == f"f: changed size while being read ({read} bytes, was {told})"


def test_a_layer_that_cannot_be_written_fails_the_checkpoint_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = writer_mod._save

    def full_disk(payload: dict[str, Any], fh: Any) -> Any:
        if payload["layer"] == "block0":
            fh.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(payload, fh)

    monkeypatch.setattr(writer_mod, "_save", full_disk)
    with pytest.raises(CheckpointWriteFailed, match="No space left on device"):
        _write(tmp_path, _payloads())
    assert list(tmp_path.iterdir()) == []  # the partial directory and every temp file are gone


def test_a_failing_temp_write_is_removed_and_the_target_kept(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def fail(fh: Any) -> None:
        fh.write(b"new")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        atomic_write_stream(target, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["f"] and target.read_bytes() == b"old"


def test_in_parallel_keeps_the_order_and_once_one_fails_starts_no_more_and_waits_for_the_rest() -> None:
    assert streams.in_parallel(lambda n: n * n, list(range(10)), workers=3) == [n * n for n in range(10)]
    started: list[int] = []
    running = threading.Event()
    ended: list[int] = []

    def work(n: int) -> int:
        started.append(n)
        if n == 1:
            assert running.wait(10)
            raise ValueError(f"item {n}")
        running.set()
        time.sleep(0.2)
        ended.append(n)
        return n

    with pytest.raises(ValueError, match="item 1"):
        streams.in_parallel(work, list(range(50)), workers=2)
    assert sorted(ended) == sorted(n for n in started if n != 1)  # nothing still running when it raised
    assert len(started) < 10


@pytest.mark.slow
def test_the_checkpoint_io_bench_runs_quickly_and_prints_only(tmp_path: Path) -> None:
    """``--quick`` writes and reads a ~20 MB checkpoint both ways, prints its table and writes no docs."""
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    result = subprocess.run(
        [sys.executable, "bench/checkpoint_io_bench.py", "--quick", f"--dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result
    out = result.stdout
    assert "toy size, not a measurement" in out, out
    rows = ("| write (", "| read, cold, a controller", "| read, warm (", "| read, cold, a standal", "| read, warm, a")
    for row in rows:
        line = next(line for line in out.splitlines() if line.startswith(row))
        ours, raw, ratio = (float(c) for c in line.split("|")[2:5])
        assert ours > 0 and raw > 0 and ratio > 0, line
    assert list(tmp_path.iterdir()) == []
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs


def test_a_v2_checkpoint_with_sha256_checksums_still_loads_and_its_damage_is_named(tmp_path: Path) -> None:
    payloads = _payloads()
    found = _write(tmp_path, payloads)
    as_sha256_format(found.path, manifest_mod.FORMAT_V2)
    found = ck.resolve(tmp_path)
    assert found.manifest.format == manifest_mod.FORMAT_V2
    assert {e.checksum[0] for e in found.manifest.files} == {streams.SHA256}
    loaded = ck.load_tensors(found, set(found.file_of_tensor()))
    assert all(_equal(loaded[f"{layer}.pt"], payload) for layer, payload in payloads.items())
    _flip_a_byte(found.path / "block1.pt")
    with pytest.raises(ck.CheckpointError, match=r"block1\.pt: SHA-256 does not match the manifest"):
        ck.verify(found.path)
    with pytest.raises(ck.CheckpointError, match=r"block1\.pt: SHA-256 does not match the manifest"):
        ck.load_tensors(found, {"block1.w"})


def _racing_commit(monkeypatch: pytest.MonkeyPatch, commit: bool) -> None:
    """Make ``.parts`` vanish between the rename of a rank's part and the fsync of its directory, as rank 0's
    commit removes it once every part is there; ``commit``: rank 0 wrote the manifest first, as it does."""
    real = durable.fsync_dir

    def fsync_dir(path: Path) -> None:
        if path.name == ".parts":
            if commit:
                (path.parent / ck.MANIFEST).write_text("{}")
            shutil.rmtree(path)
        real(path)

    monkeypatch.setattr(durable, "fsync_dir", fsync_dir)


def test_a_rank_whose_part_rank_0_committed_before_its_fsync_has_written_its_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _racing_commit(monkeypatch, commit=True)
    writer = ck.CheckpointWriter(tmp_path, 1, 2, "test", keep=2, background=False, timeout=10, generation=2)
    writer.save(18, _payloads(), None)
    assert sorted(p.name for p in ck.step_dir(tmp_path, 18, 2).iterdir()) == sorted(
        [ck.MANIFEST, *(f"{layer}.pt" for layer in _payloads())]
    )


def test_a_parts_directory_gone_without_a_commit_still_fails_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _racing_commit(monkeypatch, commit=False)
    writer = ck.CheckpointWriter(tmp_path, 1, 2, "test", keep=2, background=False, timeout=10, generation=2)
    with pytest.raises(CheckpointWriteFailed, match="checkpoint step 18 could not be written"):
        writer.save(18, _payloads(), None)
