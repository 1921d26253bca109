"""Each model-API mistake is refused at start-up with exit 2 and a message naming the layer and the rule,
before any trainer process or rendezvous, whatever the layout asked for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from torch import nn

from spotmorph.cli import main
from tests.runtime.helpers import REPO, run
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.model_api import Dropout

MISTAKES = f"{REPO}/tests/runtime/mistake_models.py"


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, entry: str, *flags: str) -> str:
    code = main(
        [
            "train",
            f"{MISTAKES}:{entry}",
            f"--checkpoint-dir={tmp_path / 'ckpt'}",
            "--global-batch=4",
            "--steps=1",
            *flags,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "ckpt").exists()
    return err


@pytest.mark.parametrize(
    ("entry", "messages"),
    [
        ("tuple_with_none", ["layer 'first' returned (float32[3, 4], NoneType)", "a tensor or a tuple of tensors"]),
        ("scalar_loss", ["one value per sample, shape [3], got []"]),
        ("per_sample_loss_in_token_mode", ["loss_normalization='token'", "shape [3, 4]", "got [3]"]),
        ("varying_shapes", ["varying shapes", "dataset[0] has input float32[2]", "dataset[2] has input float32[4]"]),
        ("global_rng_dropout", ["layer 'first'", "global random state", "it is first (FunctionalDropout)", "layout"]),
        ("channel_dropout", ["layer 'first' uses Dropout1d (first.1)", "cannot be made layout-free"]),
        ("mixes_samples", ["layer 'first' mixes samples"]),
        ("loss_mixes_samples", ["a sample's loss changes with the other samples"]),
    ],
)
@pytest.mark.parametrize("layout", [["--stages=1"], ["--stages=2", "--replicas=2"]])
def test_a_mistake_exits_2_naming_the_rule_in_any_layout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, entry: str, messages: list[str], layout: list[str]
) -> None:
    err = _refused(capsys, tmp_path, entry, *layout)
    for message in messages:
        assert message in err


def test_plain_nn_dropout_is_replaced_by_the_layout_free_one() -> None:
    spec = build_spec(f"{MISTAKES}:good", 0)
    first = dict(spec.layers)["first"]
    assert isinstance(first, nn.Sequential)
    assert type(first[1]) is Dropout and first[1].p == 0.5 and first[1].key != 0


def test_the_checks_leave_weights_buffers_and_modes_alone() -> None:
    import torch

    spec_a = build_spec(f"{MISTAKES}:good", 3, check=False)
    spec_b = build_spec(f"{MISTAKES}:good", 3)
    for (_, a), (_, b) in zip(spec_a.layers, spec_b.layers, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
        assert [m.training for m in a.modules()] == [m.training for m in b.modules()]


@pytest.mark.slow
def test_the_trainer_itself_refuses_before_the_rendezvous(tmp_path: Path) -> None:
    """The agent's path: no launcher in front, the trainer exits 2 and reports an input error."""
    from morphing.jobspec import JobSpec
    from morphing.layout import make_layout

    layout = make_layout(num_layers=2, pipeline_stages=2, data_parallel=1, micro_batch_size=1, global_batch=4)
    (tmp_path / "layout.json").write_text(json.dumps(layout.to_dict()))
    job = JobSpec(
        name="mistake", entrypoint=f"{MISTAKES}:scalar_loss", global_batch=4, steps=2, checkpoint_dir=str(tmp_path)
    )
    (tmp_path / "job.json").write_text(job.model_dump_json())
    cmd = [sys.executable, "-m", "worker_agent.runtime.process.trainer", f"--job={tmp_path / 'job.json'}"]
    cmd += [f"--layout={tmp_path / 'layout.json'}", "--rank=1", "--rendezvous=127.0.0.1:1"]
    cmd += [f"--checkpoint-dir={tmp_path / 'ckpt'}", f"--progress={tmp_path / 'progress.jsonl'}"]
    result = run(cmd, timeout=60)
    assert result.returncode == 2, result.explain()
    assert "one value per sample" in result.stderr
    last = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "error" and last["kind"] == "input"
