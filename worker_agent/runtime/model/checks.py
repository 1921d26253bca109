"""Start-up checks of a model spec: the rules the batch invariant relies on, tried before any rendezvous.

Each layer runs alone on one small micro-batch in this process, so the verdict does not depend on the
layout: a model that would fail in one layout and train in another, or train differently after a
resume, is refused with a :class:`UserInputError` (exit 2) naming the layer and the rule. The global
random state is restored afterwards and parameters are not touched; buffers are put back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeGuard

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.model.model_api import ModelSpec, sample_context
from worker_agent.runtime.numerics.batch import (
    Activation,
    as_tuple,
    call_layer,
    check_loss_shape,
    describe,
    map_tensors,
    signature,
    stack_samples,
)

MICRO_BATCH = 3  # samples in the probe micro-batch (fewer if the dataset is smaller)
DATASET_PROBES = 16  # items whose shapes are compared, spread over the dataset
RNG_SEEDS = (1234, 98765)
# Dropout flavours that drop whole channels: a per-element layout-free mask cannot express them.
CHANNEL_DROPOUTS = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
DETERMINISM_HINT = (
    "use spotmorph.Dropout (plain torch.nn.Dropout modules are replaced automatically); "
    "for Hugging Face models use spotmorph.hf.causal_lm_spec, whose attention dropout is layout-free"
)


def check_spec(spec: ModelSpec, entrypoint: str = "model") -> None:
    """Raise :class:`UserInputError` for the first rule ``spec`` breaks; see the module docstring."""
    where = f"entrypoint {entrypoint!r}"
    _refuse_channel_dropout(spec.layers, where)
    items = _probe_dataset(spec, where)
    m = min(MICRO_BATCH, len(spec.dataset))
    expected = signature(items[0])
    x, targets = stack_samples([spec.dataset[i] for i in range(m)], expected)
    dtype = _float_dtype(spec.layers)
    x = map_tensors(x, lambda t: t.to(dtype) if t.is_floating_point() else t)
    targets = targets.to(dtype) if targets.is_floating_point() else targets
    ids = torch.arange(m)
    modules = [module for _, module in spec.layers]
    with torch.random.fork_rng(devices=[]), torch.no_grad(), _training(modules), buffers_kept(modules):
        _check_activation(x, m, f"{where}: the dataset", "a dataset input")
        for name, layer in spec.layers:
            x = _check_layer(name, layer, x, ids, where)
        _check_loss(spec, x, targets, where)


def _refuse_channel_dropout(layers: Sequence[tuple[str, nn.Module]], where: str) -> None:
    for layer_name, module in layers:
        for sub_name, sub in module.named_modules():
            if isinstance(sub, CHANNEL_DROPOUTS) and float(getattr(sub, "p", 0.0)) > 0.0:
                raise UserInputError(
                    f"{where}: layer {layer_name!r} uses {type(sub).__name__} ({layer_name}.{sub_name}), which draws "
                    f"from the global random generator and cannot be made layout-free; {DETERMINISM_HINT}"
                )


def _probe_dataset(spec: ModelSpec, where: str) -> list[tuple[Activation, torch.Tensor]]:
    n = len(spec.dataset)
    picks = sorted({0, n - 1, *(k * (n - 1) // (DATASET_PROBES - 1) for k in range(DATASET_PROBES))})
    items = []
    for index in picks:
        item = spec.dataset[index]
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise UserInputError(f"{where}: dataset[{index}] is {describe(item)}; it must be (input, target)")
        inp, target = item
        if not (_tensors(inp) and isinstance(target, torch.Tensor)):
            raise UserInputError(
                f"{where}: dataset[{index}] is ({describe(inp)}, {describe(target)}); the input must be a tensor "
                "or a tuple of tensors, the target a tensor"
            )
        items.append((inp, target))
        if signature(items[-1]) != signature(items[0]):
            raise UserInputError(
                f"{where}: dataset items have varying shapes: dataset[0] has {signature(items[0])}, "
                f"dataset[{index}] has {signature(items[-1])}; the runtime stacks items into micro-batches of "
                "any size, so every item must have the same shapes (pad or cut them to one length)"
            )
    if spec.loss_normalization == "token" and items[0][1].is_floating_point():
        raise UserInputError(
            f"{where}: loss_normalization='token' needs integer targets (token ids, -100 = ignored), "
            f"got {describe(items[0][1])}"
        )
    return items


def _check_layer(name: str, layer: nn.Module, x: Activation, ids: torch.Tensor, where: str) -> Activation:
    outputs = []
    for seed in RNG_SEEDS:
        torch.manual_seed(seed)
        outputs.append(_run(name, layer, x, ids, where))
    out: Activation = outputs[0]
    _check_activation(out, len(ids), f"{where}: layer {name!r}", "a layer's output")
    if not _close(out, outputs[1]):
        culprit = _random_module(name, layer, x, ids, where)
        inside = f" (it is {culprit}: its own forward draws random numbers)" if culprit else ""
        raise UserInputError(
            f"{where}: layer {name!r} gives different outputs from the same input when the global random state "
            f"differs{inside} (torch.nn.functional.dropout, an attention dropout_p, torch.rand...): its result "
            f"would change with the layout and after a resume; {DETERMINISM_HINT}"
        )
    k = len(ids) - 1  # the same samples less the last one: their outputs must not change
    if k > 0:
        fewer = _run(name, layer, map_tensors(x, lambda t: t[:k]), ids[:k], where)
        if not _close(map_tensors(out, lambda t: t[:k]), fewer):
            raise UserInputError(
                f"{where}: layer {name!r} mixes samples (a sample's output changes with the other samples of the "
                "micro-batch, as batch normalisation does); micro-batches differ between layouts, so each sample "
                "must be computed on its own"
            )
    return out


def _random_module(name: str, layer: nn.Module, x: Activation, ids: torch.Tensor, where: str) -> str | None:
    """The module that draws the random numbers: the first to finish (children finish before their parent)
    whose inputs are the same under both global seeds and whose output is not; ``layer.path (Class)``."""
    runs = [_finished_calls(name, layer, x, ids, where, seed) for seed in RNG_SEEDS]
    modules = dict(layer.named_modules())
    for (path, inputs, a), (other, other_inputs, b) in zip(runs[0], runs[1], strict=False):
        if path != other:
            return None  # the two runs took different paths: nothing finer to say
        if _same(inputs, other_inputs) and not _same(_flat(a), _flat(b)):
            full = f"{name}.{path}" if path else name
            return f"{full} ({type(modules[path]).__name__})"
    return None


def _flat(x: Any) -> list[torch.Tensor]:
    """The tensors in a module's output, however it nests them (tuples, lists, dicts, model outputs)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, tuple | list):
        return [t for item in x for t in _flat(item)]
    return []


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(_close(s, t) for s, t in zip(a, b, strict=True))


def _finished_calls(
    name: str, layer: nn.Module, x: Activation, ids: torch.Tensor, where: str, seed: int
) -> list[tuple[str, list[torch.Tensor], Any]]:
    """Every submodule call of one run from global seed ``seed``, in the order they finish: its path, the
    tensors it was given (positional and keyword) and its output."""
    finished: list[tuple[str, list[torch.Tensor], Any]] = []

    def hook(path: str) -> Any:
        def record(_module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            given = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            finished.append((path, given, output))

        return record

    handles = [module.register_forward_hook(hook(path), with_kwargs=True) for path, module in layer.named_modules()]
    try:
        torch.manual_seed(seed)
        _run(name, layer, x, ids, where)
    finally:
        for handle in handles:
            handle.remove()
    return finished


def _run(name: str, layer: nn.Module, x: Activation, ids: torch.Tensor, where: str) -> Any:
    try:
        with sample_context(0, 0, ids):
            return call_layer(layer, x)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"{where}: layer {name!r} failed on a micro-batch given {describe(x)}: {exc!r}") from exc


def _check_activation(x: object, m: int, who: str, what: str) -> None:
    if not _tensors(x):
        raise UserInputError(
            f"{who} returned {describe(x)}; {what} must be a tensor or a tuple of tensors (no None, lists, dicts "
            "or model-output objects), because that is what crosses pipeline stages"
        )
    for t in as_tuple(x):
        if t.dim() == 0 or t.shape[0] != m:
            raise UserInputError(
                f"{who} returned {describe(x)} for a micro-batch of {m} samples; every tensor of {what} must have "
                "the sample dimension first, so that the runtime can cut batches into micro-batches"
            )


def _check_loss(spec: ModelSpec, out: Activation, targets: torch.Tensor, where: str) -> None:
    k = max(1, len(targets) - 1)
    try:
        per_item = spec.loss(out, targets)
        fewer = spec.loss(map_tensors(out, lambda t: t[:k]), targets[:k])
    except Exception as exc:
        raise UserInputError(
            f"{where}: the loss failed on {describe(out)} and targets {describe(targets)}: {exc!r}"
        ) from exc
    problem = check_loss_shape(per_item, targets, spec.loss_normalization)
    if problem is not None:
        raise UserInputError(f"{where}: {problem}")
    if not _close(per_item[:k], fewer):
        raise UserInputError(
            f"{where}: a sample's loss changes with the other samples of the micro-batch; each sample's loss "
            "must depend on that sample only, because micro-batches differ between layouts"
        )


def _tensors(x: object) -> TypeGuard[Activation]:
    if isinstance(x, torch.Tensor):
        return True
    return isinstance(x, tuple) and len(x) > 0 and all(isinstance(t, torch.Tensor) for t in x)


def _close(a: Activation, b: object) -> bool:
    if not _tensors(b) or len(as_tuple(a)) != len(as_tuple(b)):
        return False
    for s, t in zip(as_tuple(a), as_tuple(b), strict=True):
        if s.shape != t.shape or s.dtype != t.dtype:
            return False
        if s.is_floating_point():
            scale = float(s.abs().max()) if s.numel() else 0.0
            if not torch.allclose(s, t, rtol=1e-4, atol=1e-5 * max(scale, 1e-30), equal_nan=True):
                return False
        elif not torch.equal(s, t):
            return False
    return True


def _float_dtype(modules: Sequence[tuple[str, nn.Module]]) -> torch.dtype:
    for _, module in modules:
        for param in module.parameters():
            if param.is_floating_point():
                return param.dtype
    return torch.get_default_dtype()


@contextlib.contextmanager
def _training(modules: list[nn.Module]) -> Iterator[None]:
    modes = [(m, m.training) for module in modules for m in module.modules()]
    for module in modules:
        module.train()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


class BufferSnapshot:
    """Every module's buffers, by name: the tensors and their values, to be put back (a forward may update one
    in place, put a new tensor in its name, or register another)."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        every = {id(m): m for module in modules for m in module.modules()}.values()
        self._saved = [
            (m, dict(m._buffers), {n: b.detach().clone() for n, b in m._buffers.items() if b is not None})
            for m in every
        ]

    def restore(self) -> None:
        with torch.no_grad():
            for module, tensors, values in self._saved:
                module._buffers.clear()
                module._buffers.update(tensors)
                for name, value in values.items():
                    original = tensors[name]
                    if original is not None:
                        original.copy_(value)


@contextlib.contextmanager
def buffers_kept(modules: list[nn.Module]) -> Iterator[None]:
    snapshot = BufferSnapshot(modules)
    try:
        yield
    finally:
        snapshot.restore()
