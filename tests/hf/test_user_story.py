"""The issue's user story end to end: text files -> ``spotmorph data prepare`` -> a model file next to the
data that imports a helper module from its own folder and hands a Hugging Face model to ``causal_lm_spec``
-> ``spotmorph train`` in two layouts, which agree."""

from __future__ import annotations

import math
import re
import sys
import textwrap
from pathlib import Path

import pytest

from spotmorph.cli import main
from tests.runtime.helpers import run
from worker_agent.runtime.model.entrypoint import load_entrypoint
from worker_agent.runtime.storage import checkpoint as ck

MODEL_FILE = textwrap.dedent(
    """
    from pathlib import Path

    from spotmorph.data import TokenFileDataset
    from spotmorph.hf import causal_lm_spec

    from {helper} import small_gpt2


    def build():
        data = TokenFileDataset(Path(__file__).parent / "train.bin", seq_len=16)
        return causal_lm_spec(small_gpt2(data.vocab_size), data)
    """
)
HELPER_FILE = textwrap.dedent(
    """
    from transformers import GPT2Config, GPT2LMHeadModel


    def small_gpt2(vocab):
        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=16,
                            bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(config)
    """
)


def write_project(root: Path, helper: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{helper}.py").write_text(HELPER_FILE)
    (root / "model.py").write_text(MODEL_FILE.format(helper=helper))
    return f"{root / 'model.py'}:build"


def test_the_entrypoints_folder_is_importable(tmp_path: Path) -> None:
    (tmp_path / "sibling_helper_for_test.py").write_text("VALUE = 41\n")
    (tmp_path / "entry.py").write_text("import sibling_helper_for_test\n\ndef build():\n    return 1\n")
    assert load_entrypoint(f"{tmp_path / 'entry.py'}:build")() == 1
    assert str(tmp_path.resolve()) in sys.path


@pytest.mark.slow
def test_text_files_to_a_trained_hugging_face_model(tmp_path: Path) -> None:
    project = tmp_path / "project"
    entry = write_project(project, "story_helper")
    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    (tmp_path / "b.txt").write_text("pack my box with five dozen liquor jugs. " * 20)
    assert (
        main(["data", "prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), f"--out={project / 'train.bin'}"])
        == 0
    )
    for name, stages, replicas in (("one", 1, 1), ("two", 2, 1)):
        cmd = [sys.executable, "-m", "spotmorph.cli", "train", entry, f"--stages={stages}", f"--replicas={replicas}"]
        cmd += [
            "--global-batch=3",
            "--steps=2",
            "--dtype=float64",
            "--log-every=1",
            f"--checkpoint-dir={tmp_path / name}",
        ]
        result = run(cmd, timeout=300)
        assert result.returncode == 0, result.explain()
        first = float(re.findall(r"step +1  loss ([0-9.]+)", result.stdout)[0])
        assert abs(first - math.log(257)) < 0.3, result.stdout  # an untrained model: about ln(vocabulary)
    diff = ck.diff(ck.resolve(tmp_path / "one"), ck.resolve(tmp_path / "two"))
    assert diff["max_rel"] <= 1e-9, diff
