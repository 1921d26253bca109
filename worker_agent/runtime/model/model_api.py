"""The user model API: what an entrypoint returns, how it is loaded, and layout-free dropout.

A job names an entrypoint (``path/to/file.py:function`` or ``package.module:function``); calling it
returns a :class:`ModelSpec`. Layers are named so that parameter names (``layer.param``) do not depend
on where the pipeline is cut; that is what makes checkpoints load into any layout.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from worker_agent.runtime.numerics.batch import Activation
from worker_agent.runtime.numerics.dropout import Masks, apply_dropout

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
    (default 1) multiplies it. ``eval_dataset`` (items shaped as ``dataset``'s) is evaluated whole every
    ``eval_interval`` steps of the job.
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
    eval_dataset: Dataset | None = None


@dataclass(frozen=True)
class SampleContext:
    """The job seed, the step, and which samples (global dataset indices) the running micro-batch holds."""

    seed: int
    step: int
    sample_ids: torch.Tensor
    masks: Masks = field(default_factory=Masks, compare=False)  # what dropout keeps between calls (the process's)
    # Calls of each dropout key in the running layer: a module called twice (one Dropout on two residual
    # branches) draws a fresh mask each time, as torch's does; :func:`layer_started` resets them per layer.
    calls: dict[int, int] = field(default_factory=dict, compare=False)


# The running micro-batch's samples, set by the runtime around each forward (and a recomputation's re-run): a
# context variable, so nothing module-wide changes and each thread sees only what it set.
_CURRENT: contextvars.ContextVar[SampleContext | None] = contextvars.ContextVar("sample_context", default=None)


def current_sample_context() -> SampleContext | None:
    """The samples of the micro-batch being run (None outside a runtime step): for layout-free randomness."""
    return _CURRENT.get()


def layer_started() -> None:
    """A named layer starts: its dropout calls count from 0 again (so a layer recomputed alone, or run in
    another stage, draws what it drew in any layout)."""
    ctx = _CURRENT.get()
    if ctx is not None:
        ctx.calls.clear()


@contextlib.contextmanager
def sample_context(seed: int, step: int, sample_ids: torch.Tensor, masks: Masks | None = None) -> Iterator[None]:
    """Tell :class:`Dropout` which samples (global indices) the current micro-batch holds, and what it may reuse
    from earlier calls (``masks``: the runtime's own; None: a fresh one, kept only for this context)."""
    token = _CURRENT.set(SampleContext(seed, step, sample_ids, masks or Masks()))
    try:
        yield
    finally:
        _CURRENT.reset(token)


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
    call = ctx.calls.get(key, 0)
    ctx.calls[key] = call + 1
    key = key if call == 0 else _mix(key, call)
    return apply_dropout(x, ctx.sample_ids, ctx.seed, ctx.step, key, p, ctx.masks)


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


def dropout_dtypes(spec: ModelSpec, dtype: torch.dtype, autocast: torch.dtype | None) -> tuple[torch.dtype, ...]:
    """The dtypes activations may have where the model drops out (none when it never does)."""
    drops = any(isinstance(m, Dropout) and m.p > 0 for _, layer in spec.layers for m in layer.modules())
    return tuple(dict.fromkeys([dtype] + ([autocast] if autocast is not None else []))) if drops else ()


def assign_dropout_keys(layers: Sequence[tuple[str, nn.Module]]) -> None:
    """Give every :class:`Dropout` a key derived from its stable name."""
    for layer_name, module in layers:
        for sub_name, sub in module.named_modules():
            if isinstance(sub, Dropout):
                sub.key = _mix(hash_name(f"{layer_name}.{sub_name}"))


def hash_name(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1
