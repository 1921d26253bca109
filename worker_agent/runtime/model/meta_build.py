"""A model built without its weights: parameters on the meta device, one layer made real at a time.

For a model larger than one device (or than this machine's memory), ``spotmorph profile --from-config``
and ``spotmorph submit``'s profile check need its layers' names and shapes, not its values. Every
``nn.Parameter`` registered while :func:`parameters_on_meta` is active goes to the meta device (shapes and
dtypes, no storage; initialisers on it do nothing); buffers and the dataset stay real, because they are
small and their values matter (a rotary embedding's frequencies, a causal mask, the samples).
:func:`materialized` gives one layer real parameters on a device for as long as it is timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.model_api import ModelSpec

# torch.nn.init's initialisers, skipped inside parameters_on_meta(): on a meta tensor they change nothing, and the
# first normal_ there imports torch._dynamo (1.3 s here), which `spotmorph submit` would pay for every model.
INITIALISERS = tuple(
    name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_") and name != "calculate_gain"
)


def _skip(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside live on the meta device (a parameter is real only while it is made), and
    torch.nn.init's initialisers do nothing."""
    original = nn.Module.register_parameter
    initialisers = {name: getattr(torch.nn.init, name) for name in INITIALISERS}

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kept: dict[str, Any] = dict(param.__dict__)
            meta = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(kept)
            module._parameters[name] = meta

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    for name in initialisers:
        setattr(torch.nn.init, name, _skip)
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
        for name, function in initialisers.items():
            setattr(torch.nn.init, name, function)


def build_spec_on_meta(entrypoint: str, seed: int = 0) -> ModelSpec:
    """The entrypoint's spec with every parameter on the meta device (no start-up checks: they run layers)."""
    with parameters_on_meta():
        spec = build_spec(entrypoint, seed, check=False)
    real = [f"{name}.{p}" for name, layer in spec.layers for p, t in layer.named_parameters() if not t.is_meta]
    if real:
        from morphing.errors import UserInputError

        raise UserInputError(
            f"entrypoint {entrypoint!r} made parameters {real[:3]} outside nn.Module.register_parameter "
            "(loaded or copied in?); build the model from its configuration, or profile without --from-config"
        )
    return spec


def model_layer_names(entrypoint: str) -> tuple[str, ...]:
    """The names of the layers the entrypoint builds, in order, without allocating the model's weights."""
    return tuple(name for name, _ in build_spec_on_meta(entrypoint).layers)


def _fill(name: str, t: torch.Tensor, generator: torch.Generator) -> None:
    """Values that keep activations in a normal range; the timings do not depend on them otherwise."""
    if not t.is_floating_point():
        t.zero_()
    elif t.dim() >= 2:
        t.copy_(torch.randn(t.shape, generator=generator, dtype=torch.float32).mul_(0.02))
    else:
        t.fill_(1.0 if name.endswith("weight") else 0.0)


@contextlib.contextmanager
def materialized(layer: nn.Module, device: torch.device, seed: int) -> Iterator[None]:
    """``layer`` with real parameters (and its buffers) on ``device`` inside; back on the meta device after.

    A parameter shared inside the layer stays one object; one shared with another layer (tied
    embeddings) is made again when that layer's turn comes.
    """
    generator = torch.Generator().manual_seed(seed)
    made: dict[int, nn.Parameter] = {}
    undo: list[tuple[dict[str, Any], str, Any]] = []
    for module in layer.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                real = torch.empty(p.shape, dtype=p.dtype)
                with torch.no_grad():
                    _fill(name, real, generator)
                made[id(p)] = nn.Parameter(real.to(device), requires_grad=p.requires_grad)
            undo.append((module._parameters, name, p))
            module._parameters[name] = made[id(p)]
        for name, b in list(module._buffers.items()):
            if b is None:
                continue
            undo.append((module._buffers, name, b))
            module._buffers[name] = b.to(device)
    try:
        yield
    finally:
        for table, name, original in reversed(undo):
            table[name] = original
