"""``spotmorph checkpoint export --hf OUT --check``: the export, loaded with ``from_pretrained``, computes the
checkpoint's logits (float64 to 1e-10, with nothing imported by the user); a perturbed or incomplete export
fails with exit 1 naming the largest difference; bad input exits 2 with one line.

One float64 Llama (2 blocks, width 32: RMSNorm and rotary embeddings, the modules that round through
float32 unless the check keeps them in float64), trained one step, serves every test."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from unittest import mock

import pytest

from spotmorph.cli import main
from tests.hf.export_cli import export_fails
from tests.hf.test_hf_export import ENTRY, trained
from worker_agent.runtime.model import hf_export_check

PERTURBED = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("llama") / "ckpt", f"{ENTRY}:llama_token", steps=1)


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """The checkpoint exported with --check: the export, the exit code and stdout."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("export") / "hf"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["checkpoint", "export", str(checkpoint), "--hf", str(out), "--check"])
    return out, code, stdout.getvalue()


def _max_abs(text: str) -> float:
    return float(re.findall(r"max_abs ([0-9.e+-]+|inf|nan)", text)[0])


@pytest.mark.slow
def test_a_float64_export_passes_its_check_to_1e_10(
    checkpoint: Path, exported: tuple[Path, int, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, code, stdout = exported
    assert code == 0, stdout
    assert (out / "model.safetensors").is_file()
    assert "float64 logits" in stdout and "PASS: max_abs <= tolerance 1e-10" in stdout, stdout
    assert _max_abs(stdout) <= 1e-10
    with mock.patch.object(hf_export_check, "keep_float64", lambda model: []):  # the family's float32 rounding
        assert main(["checkpoint", "export", str(checkpoint), "--hf", str(out), "--check"]) == 1
    assert 1e-10 < _max_abs(capsys.readouterr().err) < 1e-5  # what a plain from_pretrained in float64 leaves
    written = (out / "model.safetensors").read_bytes()
    assert main(["checkpoint", "export", str(checkpoint), "--hf", str(out), "--check"]) == 0
    again = capsys.readouterr().out
    assert "checking it as it is (nothing written)" in again and "PASS" in again, again
    assert (out / "model.safetensors").read_bytes() == written


@pytest.mark.slow
def test_a_perturbed_or_incomplete_export_fails_naming_the_largest_difference(
    checkpoint: Path, exported: tuple[Path, int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(exported[0] / "model.safetensors"))
    perturbed = tmp_path / "perturbed"
    shutil.copytree(exported[0], perturbed)
    changed = dict(weights)
    changed[PERTURBED] = weights[PERTURBED].clone()
    changed[PERTURBED][3, 5] += 0.5
    save_file(changed, str(perturbed / "model.safetensors"), metadata={"format": "pt"})
    check = ["checkpoint", "export", str(checkpoint), "--hf", str(perturbed), "--check"]
    assert main(check) == 1
    captured = capsys.readouterr()
    assert "PASS" not in captured.out
    fail = captured.err.strip()
    assert fail.startswith("FAIL: max_abs ") and "> tolerance 1e-10" in fail, fail
    assert "largest at sample " in fail and f"the weight that differs most: {PERTURBED} (max_abs 5.000e-01)" in fail
    assert _max_abs(fail) > 1e-6
    assert main([*check, "--tolerance=1e3"]) == 0  # a bound the user chose
    assert "PASS: max_abs <= tolerance 1000" in capsys.readouterr().out

    incomplete = tmp_path / "incomplete"
    shutil.copytree(exported[0], incomplete)
    save_file({k: v for k, v in weights.items() if k != PERTURBED}, str(incomplete / "model.safetensors"))
    assert main(["checkpoint", "export", str(checkpoint), "--hf", str(incomplete), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"FAIL: missing keys in the export: ['{PERTURBED}']" in err, err


@pytest.mark.slow
def test_bad_input_to_the_check_exits_2_with_one_line(
    checkpoint: Path, exported: tuple[Path, int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(exported[0])
    (tmp_path / "empty").mkdir()
    export_fails([str(tmp_path / "nope"), "--hf", out, "--check"], capsys, "not a directory")
    export_fails([str(tmp_path / "empty"), "--hf", out, "--check"], capsys, "holds no valid checkpoint")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a model")
    export_fails(
        [str(checkpoint), "--hf", str(other), "--check"], capsys, "no config.json", "name the directory export wrote"
    )
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(exported[0] / "config.json", no_weights)
    export_fails(
        [str(checkpoint), "--hf", str(no_weights), "--check"], capsys, "from_pretrained cannot load it", "export again"
    )
    for bad in ("abc", "-1", "inf"):
        export_fails([str(checkpoint), "--hf", out, "--check", f"--tolerance={bad}"], capsys, "--tolerance", "finite")
    export_fails([str(checkpoint), "--hf", str(tmp_path / "new"), "--tolerance=1e-3"], capsys, "add --check")
    assert not (tmp_path / "new").exists()
