"""A model spec cut into pipeline stages, with tied parameters resolved to one canonical name.

Every rank builds the whole model from the same seed and keeps its stage's layers, so initial weights
do not depend on the layout. A parameter shared by several layers (tied embedding and head) is known
by the first name it appears under; a stage that holds any of its aliases holds a copy, and the copies
stay equal because their gradients are summed over all holders before the (identical) update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError
from morphing.layout import Layout
from worker_agent.runtime.model.model_api import ModelSpec, layer_started
from worker_agent.runtime.model.recompute import recomputed
from worker_agent.runtime.numerics.batch import call_layer

ComputeContext = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True)
class ParamInfo:
    """One logical parameter: its canonical name, the layers that use it, and its layer of record."""

    name: str
    layers: tuple[int, ...]

    @property
    def owner_layer(self) -> int:
        return self.layers[0]


class StageModule(nn.Module):
    """The layers of one stage, chained as the whole model chains them.

    A tuple a layer returns becomes the next layer's positional arguments here exactly as it does when
    the pipeline sends it to the next stage, so a model runs the same whichever way it is cut.
    ``compute`` is the context the layers run in (autocast for bf16 / fp16; it is entered here, so the
    pipeline's shape inference sees the dtypes the real forward sends); with ``recompute`` each layer
    keeps only its input for backward (:mod:`worker_agent.runtime.model.recompute`).
    """

    def __init__(
        self, layers: list[nn.Module], recompute: bool = False, compute: ComputeContext = contextlib.nullcontext
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)  # unnamed: the stable names live in PartitionedModel
        self.recompute = recompute
        self.compute = compute

    def forward(self, *args: torch.Tensor) -> Any:
        x: Any = args if len(args) > 1 else args[0]
        with self.compute():
            for layer in self.layers:
                layer_started()
                x = recomputed(layer, x) if self.recompute else call_layer(layer, x)
            return x


class PartitionedModel:
    """Named parameters of a spec and the stage view of a layout.

    ``untie`` (exact mode): each further layer that uses a tied parameter gets a copy of its own (a leaf of
    its own for autograd), so every use's gradient is taken separately in any layout, as it is when the
    uses sit on different stages; the copies are kept equal to the parameter (:meth:`sync_copies`).
    """

    def __init__(self, spec: ModelSpec, untie: bool = False) -> None:
        self.spec = spec
        self.layer_names = [name for name, _ in spec.layers]
        self.modules = [module for _, module in spec.layers]
        infos: dict[int, tuple[str, list[int], nn.Parameter]] = {}
        for index, module in enumerate(self.modules):
            for pname, param in module.named_parameters(remove_duplicate=False):
                full = f"{self.layer_names[index]}.{pname}"
                if id(param) not in infos:
                    infos[id(param)] = (full, [index], param)
                elif index not in infos[id(param)][1]:
                    infos[id(param)][1].append(index)
        self.params: dict[str, ParamInfo] = {}
        self.tensors: dict[str, nn.Parameter] = {}
        for full, layers, param in infos.values():
            self.params[full] = ParamInfo(full, tuple(layers))
            self.tensors[full] = param
        self.copies: dict[str, dict[int, nn.Parameter]] = {}  # name -> layer -> that layer's own copy
        if untie:
            self._untie()

    def _untie(self) -> None:
        for name, info in self.params.items():
            original = self.tensors[name]
            for layer in info.layers[1:]:
                copy = nn.Parameter(original.detach().clone(), requires_grad=original.requires_grad)
                module = self.modules[layer]
                for path, param in list(module.named_parameters(remove_duplicate=False)):
                    if param is original:
                        owner_path, _, attribute = path.rpartition(".")
                        owner = module.get_submodule(owner_path) if owner_path else module
                        if any(owner is m for i in info.layers if i != layer for m in self.modules[i].modules()):
                            raise UserInputError(
                                f"exact mode gives each layer using {name} its own copy, but layer "
                                f"{self.layer_names[layer]} reaches it through a module another layer also holds; "
                                "tie the parameter itself (head.weight = embed.weight), not a shared module"
                            )
                        setattr(owner, attribute, copy)
                self.copies.setdefault(name, {})[layer] = copy

    def to_dtype(self, dtype: torch.dtype) -> None:
        """Convert every layer (shared parameters stay shared) to the job's dtype."""
        nn.ModuleList(self.modules).to(dtype)

    def leaf(self, name: str, layer: int) -> nn.Parameter:
        """The tensor layer ``layer`` uses for parameter ``name`` (its own copy when untied)."""
        return self.copies.get(name, {}).get(layer, self.tensors[name])

    def stage_leaves(self, layout: Layout, stage: int) -> list[tuple[str, nn.Parameter]]:
        """Every tensor of the stage's layers under its parameter's name, copies included, each once."""
        first, last = layout.stage_layers[stage]
        out: dict[int, tuple[str, nn.Parameter]] = {}
        for name, info in self.params.items():
            for layer in info.layers:
                if first <= layer < last:
                    tensor = self.leaf(name, layer)
                    out.setdefault(id(tensor), (name, tensor))
        return list(out.values())

    def sync_copies(self, layout: Layout, stage: int) -> None:
        """Give the stage's copies of a tied parameter the value of the one its optimizer updates."""
        held = dict(self.stage_params(layout, stage))
        with torch.no_grad():
            for name, tensor in self.stage_leaves(layout, stage):
                if tensor is not held[name]:
                    tensor.copy_(held[name])

    def check_layout(self, layout: Layout) -> None:
        if layout.num_layers != len(self.layer_names):
            raise UserInputError(
                f"the layout partitions {layout.num_layers} layers but the model has "
                f"{len(self.layer_names)} ({', '.join(self.layer_names)}); use at most "
                f"{len(self.layer_names)} stages"
            )

    def stage_module(
        self, layout: Layout, stage: int, recompute: bool = False, compute: ComputeContext = contextlib.nullcontext
    ) -> StageModule:
        first, last = layout.stage_layers[stage]
        return StageModule([self.modules[i] for i in range(first, last)], recompute, compute)

    def stage_params(self, layout: Layout, stage: int) -> list[tuple[str, nn.Parameter]]:
        """Parameters a stage holds (each once, under its canonical name), in model order."""
        first, last = layout.stage_layers[stage]
        out = []
        for name, info in self.params.items():
            used = [i for i in info.layers if first <= i < last]
            if used:
                out.append((name, self.leaf(name, used[0])))
        return out

    def holder_stages(self, layout: Layout, name: str) -> tuple[int, ...]:
        return tuple(sorted({layout.stage_of_layer(i) for i in self.params[name].layers}))

    def owned_by_stage(self, layout: Layout, name: str, stage: int) -> bool:
        """Whether ``stage`` is the stage of record for ``name`` (counts it in norms, writes it)."""
        return layout.stage_of_layer(self.params[name].owner_layer) == stage

    def tied_across_stages(self, layout: Layout) -> list[tuple[str, tuple[int, ...]]]:
        """Parameters held by more than one stage of ``layout``, with those stages, in a fixed order."""
        out = []
        for name in sorted(self.params):
            holders = self.holder_stages(layout, name)
            if len(holders) > 1:
                out.append((name, holders))
        return out

    def layer_params(self, layer: int) -> list[str]:
        """Parameters whose layer of record is ``layer``."""
        return [name for name, info in self.params.items() if info.owner_layer == layer]
