"""``spotmorph checkpoint export --hf``: a trained checkpoint loads with ``from_pretrained`` and computes the
logits spotmorph computes; bad input exits 2 with one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from spotmorph.cli import main
from tests.hf import hf_models
from tests.hf.export_cli import export_fails
from tests.runtime.helpers import REPO, TINY, run, train_cmd
from worker_agent.runtime.model.hf_adapter import hf_parameter_name
from worker_agent.runtime.model.hf_export import CONFIG_FILE
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.numerics.batch import run_layers
from worker_agent.runtime.storage import checkpoint as ck

ENTRY = f"{REPO}/tests/hf/hf_models.py"


def trained(root: Path, entrypoint: str, steps: int = 2) -> Path:
    cmd = train_cmd(root, 1, 1, steps, "--dtype=float64", entrypoint=entrypoint)
    result = run(cmd, timeout=300)
    assert result.returncode == 0, result.explain()
    return root


def spotmorph_logits(build: Any, ckpt: ck.Checkpoint | None, ids: torch.Tensor) -> torch.Tensor:
    """The adapter's layers run in order in eval mode, with the checkpoint's parameters (if given)."""
    torch.manual_seed(0)
    spec = build()
    model = PartitionedModel(spec)
    params = ck.read_all(ckpt) if ckpt is not None else {}
    with torch.no_grad():
        for name, tensor in model.tensors.items():
            tensor.data = params.get(f"param/{name}", tensor.data.double()).clone()
        for _, layer in spec.layers:
            layer.eval()
        return run_layers([m for _, m in spec.layers], ids)  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "cls"), [("gpt2_token", "GPT2LMHeadModel"), ("llama_token", "LlamaForCausalLM")])
def test_an_exported_checkpoint_loads_in_transformers_with_the_same_logits(
    tmp_path: Path, entry: str, cls: str
) -> None:
    import transformers

    from worker_agent.runtime.model.hf_float64 import keep_float64

    root = trained(tmp_path / "ckpt", f"{ENTRY}:{entry}")
    assert (root / CONFIG_FILE).is_file()
    out = tmp_path / "hf"
    assert main(["checkpoint", "export", str(root), "--hf", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    hf = getattr(transformers, cls).from_pretrained(str(out), dtype=torch.float64).eval()
    ids = hf_models.LabelledSequences()[3][0].unsqueeze(0)
    ckpt = ck.resolve(root)
    ours = spotmorph_logits(getattr(hf_models, entry), ckpt, ids)
    with torch.no_grad():
        family_own = hf(ids).logits  # Llama's RMSNorm rounds through float32, even in float64
        keep_float64(hf)  # spotmorph's float64: the family's code with its upcasts in float64
        theirs = hf(ids).logits
    assert theirs.dtype == torch.float64
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-10), (theirs - ours).abs().max()
    assert torch.allclose(family_own, ours, rtol=0, atol=1e-6), (family_own - ours).abs().max()
    fresh = spotmorph_logits(getattr(hf_models, entry), None, ids)
    assert (fresh - ours).abs().max() > 1e-3  # the checkpoint's weights, not a freshly built model's
    again = tmp_path / "again"
    assert main(["checkpoint", "export", str(root / ckpt.path.name), "--hf", str(again), f"--config-from={out}"]) == 0
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_names_map_back_to_the_hugging_face_state_dict() -> None:
    assert hf_parameter_name("gpt2", "layer3.block.mlp.c_fc.weight") == "transformer.h.3.mlp.c_fc.weight"
    assert hf_parameter_name("gpt2", "embed.positions.weight") == "transformer.wpe.weight"
    assert hf_parameter_name("llama", "head.norm.weight") == "model.norm.weight"
    assert hf_parameter_name("llama", "head.lm_head.weight") == "lm_head.weight"
    assert hf_parameter_name("llama", "embed.positions.weight") is None
    assert hf_parameter_name("gpt2", "block0.weight") is None
    assert hf_parameter_name("bert", "embed.tokens.weight") is None


@pytest.mark.slow
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    export_fails([str(tmp_path / "nope"), "--hf", out], capsys, "not a directory")
    root = trained(tmp_path / "gpt2", f"{ENTRY}:gpt2_token", steps=1)
    step = ck.resolve(root).path
    damaged = tmp_path / "damaged" / step.name
    shutil.copytree(step, damaged)
    layer = damaged / "layer0.pt"
    layer.write_bytes(layer.read_bytes()[:-5] + b"xxxxx")
    export_fails([str(damaged), "--hf", out], capsys, "damaged")
    export_fails([str(damaged.parent), "--hf", out], capsys, "no valid checkpoint")
    no_config = tmp_path / "no-config" / step.name
    shutil.copytree(step, no_config)
    export_fails([str(no_config), "--hf", out], capsys, CONFIG_FILE, "--config-from")
    (tmp_path / "no-config" / CONFIG_FILE).write_text("{not json")
    export_fails([str(no_config), "--hf", out], capsys, "damaged")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    export_fails([str(root), "--hf", str(tmp_path / "busy")], capsys, "not an empty directory")
    tiny = trained(tmp_path / "tiny", TINY, steps=1)
    export_fails([str(tiny), "--hf", out, f"--config-from={ENTRY}:gpt2_token"], capsys, "another model")
    export_fails([str(tiny), "--hf", out, f"--config-from={TINY}"], capsys, "causal_lm_spec")
    assert not Path(out).exists()


@pytest.mark.slow
def test_a_hostile_hf_config_exits_2_before_anything_is_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config is refused on the meta device: a huge ``n_embd`` allocates nothing, a negative one is no traceback."""
    import json
    import os

    root = trained(tmp_path / "gpt2", f"{ENTRY}:gpt2_token", steps=1)
    config_file = root / CONFIG_FILE
    good = json.loads(config_file.read_text())
    out = str(tmp_path / "out")
    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({"n_embd": 65536}, ("does not fit", "transformer.wte.weight")),
        ({"n_embd": -64}, ("describes no model",)),
        ({"n_layer": 10**9}, ("decoder layers", "1000000000")),
    ]
    for change, words in cases:
        config_file.write_text(json.dumps({**good, **change}))
        export_fails([str(root), "--hf", out], capsys, *words)
    config_file.write_text("[" * 100_000 + "]" * 100_000)
    export_fails([str(root), "--hf", out], capsys, "nests deeper")
    config_file.unlink()
    os.mkfifo(config_file)
    export_fails([str(root), "--hf", out], capsys, "not a regular file (a FIFO)")
    assert not Path(out).exists()
