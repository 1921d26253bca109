"""``spotmorph profile --from-config``: the model on the meta device, one layer real at a time, and the
names ``spotmorph submit`` sends for the controller's profile check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from spotmorph.cli import main
from tests.runtime.helpers import BAD_MODELS, REPO, TINY
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.meta_build import build_spec_on_meta, model_layer_names
from worker_agent.runtime.profiling.layer_timing import Where
from worker_agent.runtime.profiling.profiler_meta import profile_layers_one_at_a_time

HF_GPT2 = f"{REPO}/examples/hf_gpt2.py:build"  # tied embeddings, position ids between layers, learned positions
MEMORY = ("parameter_bytes", "activation_memory_bytes_per_sample", "output_activation_bytes_per_sample")


def profile(tmp_path: Path, name: str, *extra: str, entrypoint: str = TINY) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    flags = ["--micro-batch-sizes=1,3", "--repeats=1", "--no-network", f"--out={out}"]
    assert main(["profile", entrypoint, *flags, *extra]) == 0
    return dict(json.loads(out.read_text()))


def test_the_model_is_built_without_its_weights_and_with_its_data() -> None:
    spec = build_spec_on_meta(TINY)
    params = [p for _, layer in spec.layers for p in layer.parameters()]
    assert params and all(p.is_meta for p in params)
    x, target = spec.dataset[0]
    assert isinstance(x, torch.Tensor) and not x.is_meta and not target.is_meta
    real = build_spec(TINY, 0)
    assert model_layer_names(TINY) == tuple(name for name, _ in real.layers)
    shapes = [(n, tuple(p.shape), p.dtype) for _, layer in real.layers for n, p in layer.named_parameters()]
    assert [(n, tuple(p.shape), p.dtype) for _, layer in spec.layers for n, p in layer.named_parameters()] == shapes


@pytest.mark.parametrize(("entrypoint", "dtype"), [(TINY, "float32"), (TINY, "float64"), (HF_GPT2, "float32")])
def test_memory_per_layer_is_the_chained_profiles_to_the_byte(tmp_path: Path, entrypoint: str, dtype: str) -> None:
    chained = profile(tmp_path, "chained", f"--dtype={dtype}", entrypoint=entrypoint)
    alone = profile(tmp_path, "alone", f"--dtype={dtype}", "--from-config", entrypoint=entrypoint)
    assert [layer["name"] for layer in alone["layers"]] == [layer["name"] for layer in chained["layers"]]
    for ours, theirs in zip(alone["layers"], chained["layers"], strict=True):
        assert {k: ours[k] for k in MEMORY} == {k: theirs[k] for k in MEMORY}, ours["name"]
        assert set(ours["forward_seconds"]) == {"1", "3"} and min(ours["backward_seconds"].values()) > 0
    assert alone["optimizer_bytes_per_parameter_byte"] == chained["optimizer_bytes_per_parameter_byte"] == 2.0
    assert "meta device" in alone["source"] and "meta device" not in chained["source"]


def test_only_the_layer_being_timed_has_real_weights() -> None:
    spec = build_spec_on_meta(TINY)
    seen: list[tuple[str, int, int]] = []

    def watch(name: str, layer: nn.Module) -> None:
        def hook(module: nn.Module, args: Any) -> None:
            own = {id(p) for p in module.parameters()}
            others = [p for _, other in spec.layers for p in other.parameters() if id(p) not in own]
            elsewhere = [p for p in others if not p.is_meta]
            seen.append((name, sum(not p.is_meta for p in module.parameters()), len(elsewhere)))

        layer.register_forward_pre_hook(hook)

    for name, layer in spec.layers:
        watch(name, layer)
    records = profile_layers_one_at_a_time(spec, (2,), 0, 1, Where(torch.device("cpu")), torch.float32)
    assert [r["name"] for r in records] == [name for name, _ in spec.layers]
    assert {name for name, _, _ in seen} == {name for name, _ in spec.layers}
    for name, real, elsewhere in seen:
        layer = dict(spec.layers)[name]
        assert real == len(list(layer.parameters())) and elsewhere == 0, (name, real, elsewhere)
    assert all(p.is_meta for _, layer in spec.layers for p in layer.parameters()), "every layer is put back"


def test_a_parameter_the_meta_build_cannot_see_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    entrypoint = f"{BAD_MODELS}:parameter_set_by_hand"
    assert main(["profile", entrypoint, "--from-config", "--no-network", f"--out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "embed.extra" in err and "outside nn.Module.register_parameter" in err and "\n" not in err, err
    assert not out.exists()


def test_the_initialisers_and_parameter_registration_are_put_back_even_when_the_build_fails() -> None:
    from morphing.errors import UserInputError
    from worker_agent.runtime.model.meta_build import INITIALISERS

    before = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    register = nn.Module.register_parameter
    build_spec_on_meta(TINY)
    with pytest.raises(UserInputError, match="model construction failed"):
        build_spec_on_meta(f"{BAD_MODELS}:raises")
    assert {name: getattr(torch.nn.init, name) for name in INITIALISERS} == before and "normal_" in before
    assert nn.Module.register_parameter is register
    layer = nn.Linear(4, 4)
    assert not layer.weight.is_meta and layer.weight.abs().sum() > 0  # built and initialised for real again
