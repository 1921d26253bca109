"""The user model API: what an entrypoint returns, how it is loaded, and layout-free dropout.

A job names an entrypoint (``path/to/file.py:function`` or ``package.module:function``); calling it
returns a :class:`ModelSpec`. Layers are named so that parameter names (``layer.param``) do not depend
on where the pipeline is cut; that is what makes checkpoints load into any layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.batch import NORMALIZATIONS, Activation
from worker_agent.runtime.dropout import apply_dropout

OptimizerFactory = Callable[[list[tuple[str, nn.Parameter]]], torch.optim.Optimizer]
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


class Dataset(Protocol):
    """Indexable samples: ``dataset[i]`` is ``(input, target)`` of fixed shapes; the input may be a tuple
    of tensors (token ids and position ids, say), which the first layer receives as positional arguments."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Activation, torch.Tensor]: ...


@dataclass(frozen=True)
class ModelSpec:
    """Everything the runtime needs from a user model.

    ``layers`` are applied in order; each takes and returns a tensor or a tuple of tensors (sample
    dimension first in every one), and a returned tuple becomes the next layer's positional arguments.
    ``loss`` maps the last layer's output and a micro-batch's targets to one loss per sample (shape
    ``[batch]``) with ``loss_normalization="sample"``: the runtime divides the weighted sum by the global
    batch. With ``"token"`` it returns one loss per target token (the targets' shape), targets equal to
    -100 count zero, and the runtime divides by the step's number of other targets, as language models
    average over tokens. Tied weights are expressed by sharing one ``nn.Parameter`` object between layers;
    the runtime keeps copies on the stages that hold them and sums their gradients.
    ``lr_schedule(step)`` gives the learning rate of step ``step`` (from 0); a param group's ``lr_scale``
    (default 1) multiplies it.
    """

    layers: Sequence[tuple[str, nn.Module]]
    loss: LossFn
    dataset: Dataset
    optimizer: OptimizerFactory
    lr_schedule: Callable[[int], float]
    clip_grad_norm: float | None = None
    name: str = "model"
    extra: dict[str, Any] = field(default_factory=dict)
    loss_normalization: str = "sample"


def load_entrypoint(entrypoint: str) -> Callable[[], Any]:
    """The function an entrypoint names; a :class:`UserInputError` says what is wrong with it."""
    target, sep, func_name = entrypoint.rpartition(":")
    if not sep or not target or not func_name:
        raise UserInputError(
            f"entrypoint {entrypoint!r} must look like path/to/file.py:function or package.module:function"
        )
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UserInputError(f"entrypoint file {target} does not exist")
        # Its own directory first, as `python file.py` would have it: helper modules next to it import.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = "spotmorph_user_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UserInputError(f"entrypoint file {target} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise UserInputError(f"importing {target} failed: {exc!r}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserInputError(f"entrypoint module {target} cannot be imported: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UserInputError(f"entrypoint {entrypoint!r}: {target} has no function {func_name!r}")
    return func  # type: ignore[no-any-return]


def build_spec(entrypoint: str, seed: int, *, check: bool = True) -> ModelSpec:
    """Call the entrypoint under ``torch.manual_seed(seed)`` so every rank builds identical weights.

    Plain ``torch.nn.Dropout`` modules become layout-free :class:`Dropout`, and the start-up checks
    (:mod:`worker_agent.runtime.checks`) run here, in one process before any rendezvous, so a model
    the runtime cannot train layout-free is refused with exit 2 whatever the layout.
    """
    func = load_entrypoint(entrypoint)
    torch.manual_seed(seed)
    try:
        spec = func()
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"entrypoint {entrypoint!r} raised {exc!r}") from exc
    spec = validate_spec(spec, entrypoint)
    make_dropout_layout_free(spec.layers)
    assign_dropout_keys(spec.layers)
    if check:
        from worker_agent.runtime.checks import check_spec  # it runs layers: it imports this module

        check_spec(spec, entrypoint)
    return spec


def validate_spec(spec: object, entrypoint: str) -> ModelSpec:
    if not isinstance(spec, ModelSpec):
        raise UserInputError(
            f"entrypoint {entrypoint!r} returned {type(spec).__name__}, expected "
            "worker_agent.runtime.model_api.ModelSpec (see docs/runtime.md)"
        )
    names = [name for name, _ in spec.layers]
    if not names:
        raise UserInputError(f"entrypoint {entrypoint!r}: the model spec lists no layers")
    if len(set(names)) != len(names):
        raise UserInputError(f"entrypoint {entrypoint!r}: layer names must be unique, got {names}")
    for name, module in spec.layers:
        if not isinstance(module, nn.Module):
            raise UserInputError(f"entrypoint {entrypoint!r}: layer {name!r} is not a torch.nn.Module")
        if not name or "." in name or "/" in name:
            raise UserInputError(f"entrypoint {entrypoint!r}: layer name {name!r} must be non-empty, no . or /")
    if spec.loss_normalization not in NORMALIZATIONS:
        raise UserInputError(
            f"entrypoint {entrypoint!r}: loss_normalization={spec.loss_normalization!r}; use 'sample' or 'token'"
        )
    for attr in ("loss", "optimizer", "lr_schedule"):
        if not callable(getattr(spec, attr)):
            raise UserInputError(f"entrypoint {entrypoint!r}: spec.{attr} must be callable")
    try:
        size = len(spec.dataset)
    except TypeError as exc:
        raise UserInputError(f"entrypoint {entrypoint!r}: spec.dataset has no len()") from exc
    if size <= 0:
        raise UserInputError(f"entrypoint {entrypoint!r}: the dataset is empty")
    return spec


@dataclass(frozen=True)
class SampleContext:
    """The job seed, the step, and which samples (global dataset indices) the running micro-batch holds."""

    seed: int
    step: int
    sample_ids: torch.Tensor


_context: list[SampleContext] = []


def current_sample_context() -> SampleContext | None:
    """The samples of the micro-batch being run (None outside a runtime step): for layout-free randomness."""
    return _context[-1] if _context else None


@contextlib.contextmanager
def sample_context(seed: int, step: int, sample_ids: torch.Tensor) -> Iterator[None]:
    """Tell :class:`Dropout` which samples (global indices) the current micro-batch holds."""
    _context.append(SampleContext(seed, step, sample_ids))
    try:
        yield
    finally:
        _context.pop()


class Dropout(nn.Module):
    """Dropout whose mask is a function of (seed, step, sample index, layer key), not of the process.

    The runtime sets ``key`` from the layer's stable name. Outside a runtime step (or in eval mode) it
    is the identity when not training and falls back to ``torch.nn.functional.dropout`` otherwise.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.key = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layout_free_dropout(x, self.p, self.key, self.training)


def layout_free_dropout(x: torch.Tensor, p: float, key: int, training: bool = True) -> torch.Tensor:
    """What :class:`Dropout` does, for code with no module to replace (attention probabilities).

    ``x`` must hold the running micro-batch's samples first. Outside a runtime step there are no sample
    indices, and it falls back to ``torch.nn.functional.dropout``.
    """
    if not training or p == 0.0:
        return x
    ctx = current_sample_context()
    if ctx is None:
        return nn.functional.dropout(x, p, True)
    if ctx.sample_ids.numel() != x.shape[0]:
        raise ValueError(
            f"dropout {key}: the activation holds {x.shape[0]} samples but the step names "
            f"{ctx.sample_ids.numel()}; layers must keep the sample dimension first"
        )
    return apply_dropout(x, ctx.sample_ids, ctx.seed, ctx.step, key, p)


def make_dropout_layout_free(layers: Sequence[tuple[str, nn.Module]]) -> list[str]:
    """Replace every plain ``torch.nn.Dropout`` in ``layers`` by :class:`Dropout` with the same ``p``.

    ``build_spec`` calls it, so models written with ``nn.Dropout`` (Hugging Face ones included) get masks
    that do not depend on the layout. Returns the stable names of the replaced modules.
    """
    replaced = []
    for layer_name, module in layers:
        for parent_name, parent in list(module.named_modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is nn.Dropout:
                    setattr(parent, child_name, Dropout(child.p).train(child.training))
                    replaced.append(".".join(n for n in (layer_name, parent_name, child_name) if n))
    return replaced


def _mix(*values: int) -> int:
    digest = hashlib.blake2b(repr(values).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def assign_dropout_keys(layers: Sequence[tuple[str, nn.Module]]) -> None:
    """Give every :class:`Dropout` a key derived from its stable name."""
    for layer_name, module in layers:
        for sub_name, sub in module.named_modules():
            if isinstance(sub, Dropout):
                sub.key = _mix(hash_name(f"{layer_name}.{sub_name}"))


def hash_name(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1
