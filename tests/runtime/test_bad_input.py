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

    layout = make_layout(num_layers=6, pipeline_stages=2, data_parallel=1, micro_batch_size=1, global_batch=4)
    (tmp_path / "layout.json").write_text(json.dumps(layout.to_dict()))
    (tmp_path / "job.json").write_text(
        JobSpec(
            name="t", entrypoint=TINY, global_batch=4, steps=1, checkpoint_dir=str(tmp_path / "ckpt")
        ).model_dump_json()
    )
    cmd = [sys.executable, "-m", "worker_agent.runtime.trainer", f"--job={tmp_path / 'job.json'}"]
    cmd += [f"--layout={tmp_path / 'layout.json'}", "--rank=0", "--rendezvous=127.0.0.1:1"]
    cmd += [f"--checkpoint-dir={tmp_path / 'ckpt'}", f"--progress={tmp_path / 'progress.jsonl'}"]
    result = run(cmd, timeout=60)
    assert result.returncode == 2, result.explain()
    assert "partitions 6 layers but the model has 4" in result.stderr
    last = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "error" and last["kind"] == "input"
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
