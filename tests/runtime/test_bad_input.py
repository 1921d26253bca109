"""Bad input exits 2 with one clear line and overwrites nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from spotmorph.cli import main
from tests.runtime.helpers import BAD_MODELS, REPO, TINY, run, snapshot, train

pytestmark = pytest.mark.slow


def _train(capsys: pytest.CaptureFixture[str], entrypoint: str, ckpt: Path, *extra: str) -> str:
    code = main(["train", entrypoint, f"--checkpoint-dir={ckpt}", "--global-batch=4", "--steps=1", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("no/such/file.py:build", "does not exist"),
        ("no_such_package.model:build", "cannot be imported"),
        (f"{REPO}/examples/tiny_gpt.py:no_such_function", "has no function 'no_such_function'"),
        (f"{BAD_MODELS}:returns_dict", "returned dict, expected"),
        (f"{BAD_MODELS}:raises", "model construction failed"),
        ("build", "field entrypoint: Value error, use path/file.py:function"),
    ],
)
def test_bad_entrypoint(capsys: pytest.CaptureFixture[str], tmp_path: Path, entrypoint: str, message: str) -> None:
    err = _train(capsys, entrypoint, tmp_path / "ckpt")
    assert message in err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stages=5"], "pipeline_stages=5 > layers=4"),
        (["--replicas=5"], "data_parallel=5 > global_batch=4"),
        (["--stages=0"], "use at least 1"),
    ],
)
def test_layout_that_does_not_fit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], message: str
) -> None:
    assert message in _train(capsys, TINY, tmp_path / "ckpt", *flags)


def test_checkpoint_from_another_job_is_refused_and_left_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    train(ckpt, 1, 1, 1)
    before = snapshot(ckpt)
    err = _train(capsys, TINY, ckpt, "--seed=1", "--global-batch=7")
    assert "belongs to another job" in err
    other = tmp_path / "other"
    err = _train(capsys, TINY, other, "--global-batch=7", f"--load-from={ckpt}")
    assert "belongs to another job" in err
    assert snapshot(ckpt) == before
    assert not other.exists()


def test_trainer_entry_rejects_a_layout_that_does_not_fit_the_model(tmp_path: Path) -> None:
    """The agent's path: the trainer itself refuses before it joins the rendezvous."""
    from morphing.jobspec import JobSpec
    from morphing.layout import make_layout
    from worker_agent.contract import ExitCode, TrainerArguments, TrainerFailed, TrainersDir, read_progress

    directory = TrainersDir(tmp_path).generation_dir("job-1", 1)
    directory.path.mkdir(parents=True)
    layout = make_layout(num_layers=6, pipeline_stages=2, data_parallel=1, micro_batch_size=1, global_batch=4)
    directory.layout_file.write_text(json.dumps(layout.to_dict()))
    job = JobSpec(name="t", entrypoint=TINY, global_batch=4, steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    directory.job_file.write_text(job.model_dump_json())
    arguments = TrainerArguments.in_generation_dir(directory, 0, "127.0.0.1:1", tmp_path / "ckpt")
    result = run(arguments.command(sys.executable), timeout=60)
    assert result.returncode == ExitCode.USER_ERROR, result.explain()
    assert "partitions 6 layers but the model has 4" in result.stderr
    last = read_progress(directory.progress_file(0))[-1].event
    assert isinstance(last, TrainerFailed) and last.kind == "input"
    assert not (tmp_path / "ckpt").exists()


def test_damaged_checkpoint_given_explicitly_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    train(ckpt, 1, 1, 1)
    step = next(ckpt.glob("step-*"))
    shutil.copytree(step, tmp_path / "copy" / step.name)
    (tmp_path / "copy" / step.name / "head.pt").write_bytes(b"junk")
    source = tmp_path / "copy" / step.name
    err = _train(capsys, TINY, tmp_path / "new", "--global-batch=7", "--dtype=float64", f"--load-from={source}")
    assert "is damaged" in err
