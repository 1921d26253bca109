"""Careless `spotmorph submit` input: every mistake exits 2 with one line naming it; a mistake in the spec is
found before any connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.client import connection
from spotmorph.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_gpt.yaml"


def submit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    # an address nothing listens on: a spec that got past validation would fail differently (exit 5)
    code = main(["submit", *args, "--controller", "127.0.0.1:9", "--token", "t"])
    return code, capsys.readouterr().err


def spec_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("name=@job", "--set 'name=@job': the value is not a YAML scalar"),
        ("name=`x`", "not a YAML scalar"),
        ("steps=[1", "not a YAML scalar"),
        ("checkpoint_dir=", "--set checkpoint_dir=: give a value"),
        ("checkpoint_dir=  ", "give a value"),
        ("steps=[1, 2]", "not a list or a mapping"),
        ("steps=true", "steps"),
        ('global_batch="8"', "global_batch"),
    ],
)
def test_bad_set_values_exit_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], assignment: str, expected: str
) -> None:
    code, err = submit(capsys, str(EXAMPLE), "--set", assignment)
    assert code == 2, err
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_boolean_is_not_a_step_count(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("steps: 200", "steps: true")
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and "steps" in err


def test_a_field_given_twice_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text() + "steps: 300\n"
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and "'steps' is given twice" in err


def test_a_huge_spec_is_refused_before_parsing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text() + "# " + "x" * (2 << 20) + "\n"
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and "over 1024 KiB" in err


def test_an_empty_checkpoint_dir_is_not_the_spec_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("checkpoint_dir: ../runs/tiny-gpt/checkpoints", 'checkpoint_dir: ""')
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and "checkpoint_dir" in err


def test_control_characters_in_a_path_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("checkpoint_dir: ../runs/tiny-gpt/checkpoints", 'checkpoint_dir: "ck\\0pt"')
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and "control characters" in err


def test_a_model_that_cannot_be_built_here_is_refused_before_it_is_sent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotmorph submit` builds the model on the meta device to send its layer names for the profile check,
    once the controller answers (tests/cli/test_controller_unreachable.py): here, as if one did."""
    monkeypatch.setattr(connection, "answers", lambda *args: "")
    broken = f"entrypoint={Path(__file__).resolve().parents[1] / 'runtime' / 'bad_models.py'}:raises"
    code, err = submit(capsys, str(EXAMPLE), "--set", broken)
    assert code == 2 and err.count("\n") == 1, err
    assert "building the model here to check its profile failed" in err and "model construction failed" in err
    assert "--skip-model-check" in err
    code, err = submit(capsys, str(EXAMPLE), "--set", broken, "--skip-model-check")
    assert code != 2 and "building the model" not in err, err  # sent: nothing listens at 127.0.0.1:9
