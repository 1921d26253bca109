"""The main acceptance test: a job morphed through a chain of layouts (with a graceful stop and
resumes between them) ends with the same parameters and optimizer state as one process."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime.helpers import run, train, train_cmd, wait_for
from worker_agent.contract import ExitCode, GenerationDir, StepCompleted, TrainingStopped, events_of, read_progress
from worker_agent.runtime.storage import checkpoint as ck

# One worker runs the module and its training fixture is session-scoped: it runs once, not once per xdist
# worker, nor again after the worker ran another module's tests in between (a module scope would tear it down).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("equivalence-chain")]


@dataclass(frozen=True)
class Chain:
    root: Path
    reference: Path
    stopped_at: int
    final_step: int
    run_dir: Path
    stopped_checkpoint: Path


@pytest.fixture(scope="session")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    base = tmp_path_factory.mktemp("chain")
    root, reference, run_dir = base / "morphed", base / "reference", base / "run"
    train(root, 1, 1, 2)
    # 2x2 runs "forever" until the control file asks it to stop.
    proc = subprocess.Popen(
        [*train_cmd(root, 2, 2, 1000, "--dtype=float64", f"--run-dir={run_dir}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    directory = GenerationDir(run_dir)
    progress = directory.progress_file(0)
    try:
        wait_for(lambda: any(e.step >= 4 for e in events_of(read_progress(progress), StepCompleted)), 90, "step 4")
        directory.control.request_stop()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.SUCCEEDED, f"exit {proc.returncode}\n{out}\n{err}"
    stopped = events_of(read_progress(progress), TrainingStopped)
    assert stopped, err
    s = stopped[0].step
    # Later legs prune it (keep 3): keep a copy of the checkpoint the 2x2 layout wrote at the stop.
    shutil.copytree(ck.step_dir(root, s), base / "stopped-2x2" / ck.step_dir(root, s).name)
    train(root, 3, 1, s + 2, "--background-checkpoint", "--checkpoint-interval=1")
    train(root, 1, 3, s + 4)
    train(root, 2, 1, s + 6)
    train(reference, 1, 1, s + 6)
    return Chain(root, reference, s, s + 6, run_dir, base / "stopped-2x2" / ck.step_dir(root, s).name)


def test_morphed_chain_matches_single_process_reference_float64(chain: Chain) -> None:
    result = ck.diff(ck.resolve(chain.reference), ck.resolve(chain.root))
    assert result["step_a"] == result["step_b"] == chain.final_step
    assert result["missing"] == []
    assert result["tensors_compared"] > 20
    assert result["max_rel"] <= 1e-9, result


def test_graceful_stop_loses_no_step(chain: Chain) -> None:
    records = read_progress(GenerationDir(chain.run_dir).progress_file(0))
    last_step = max(e.step for e in events_of(records, StepCompleted))
    stopped = events_of(records, TrainingStopped)[0]
    assert stopped.step == last_step == chain.stopped_at
    assert stopped.last_checkpoint == chain.stopped_at
    manifest = ck.verify(chain.stopped_checkpoint).manifest
    assert manifest.step == chain.stopped_at
    assert manifest.data_cursor.samples_consumed == 7 * chain.stopped_at
    # Writes are spread over the replicas of each stage: all four ranks wrote a layer file.
    assert sorted(f.writer_rank for f in manifest.files) == [0, 1, 2, 3]


def test_every_rank_agrees_on_the_stop_step(chain: Chain) -> None:
    for rank in range(4):
        records = read_progress(GenerationDir(chain.run_dir).progress_file(rank))
        assert [e.step for e in events_of(records, TrainingStopped)] == [chain.stopped_at]


def test_progress_lines_carry_step_loss_throughput_and_checkpoint(chain: Chain) -> None:
    steps = [
        r for r in read_progress(GenerationDir(chain.run_dir).progress_file(0)) if isinstance(r.event, StepCompleted)
    ]
    assert steps
    for record in steps:
        assert isinstance(record.event, StepCompleted) and record.generation == 0 and record.pid > 0
        assert record.event.loss > 0 and record.event.samples_per_second > 0


def test_checkpoints_keep_the_last_k(chain: Chain) -> None:
    kept = [step for step, path in ck.step_dirs(chain.root) if (path / ck.MANIFEST).exists()]
    assert kept == [chain.final_step, chain.final_step - 2, chain.final_step - 4]


def test_checkpoint_from_2x2_loads_into_3x1_and_1x1_and_back_identically(chain: Chain, tmp_path: Path) -> None:
    source = chain.stopped_checkpoint
    assert ck.verify(source).manifest.layout["data_parallel"] == 2
    hops = [(3, 1), (1, 1), (2, 2)]
    previous = source
    for i, (p, d) in enumerate(hops):
        target = tmp_path / f"hop{i}"
        train(target, p, d, chain.stopped_at, f"--load-from={previous}")
        previous = ck.step_dir(target, chain.stopped_at)
        result = ck.diff(ck.resolve(source), ck.resolve(previous))
        assert result["missing"] == [] and result["max_abs"] == 0.0, (p, d, result)
    assert ck.verify(previous).manifest.layout["pipeline_stages"] == 2


def test_diff_command_json(chain: Chain) -> None:
    import json
    import sys

    result = run(
        [sys.executable, "-m", "spotmorph.cli", "checkpoint", "diff", str(chain.reference), str(chain.root), "--json"]
    )
    assert result.returncode == 0, result.explain()
    data = json.loads(result.stdout)
    assert {"step_a", "step_b", "max_abs", "max_rel", "tensors_compared", "missing"} <= set(data)
    assert data["max_rel"] <= 1e-9


def test_float32_layouts_agree_within_the_documented_tolerance(tmp_path: Path) -> None:
    for p, d in ((1, 1), (2, 2)):
        result = run(train_cmd(tmp_path / f"{p}x{d}", p, d, 10, "--dtype=float32"))
        assert result.returncode == 0, result.explain()
    diff = ck.diff(ck.resolve(tmp_path / "1x1"), ck.resolve(tmp_path / "2x2"))
    assert diff["missing"] == [] and diff["step_a"] == diff["step_b"] == 10
    assert diff["max_rel"] <= 1e-2, diff
