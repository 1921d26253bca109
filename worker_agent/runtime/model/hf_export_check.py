"""``spotmorph checkpoint export --check``: an export is only as good as the logits it computes, so the
export is loaded the way a user loads it (``AutoModelForCausalLM.from_pretrained``) and run against the
checkpoint's model as the trainer runs it (the adapter's layers of a model built from the config, with the
checkpoint's parameters) on a deterministic batch of token ids.

Both run in the checkpoint's dtype on the CPU. For a float64 checkpoint the export is loaded in float64
and its RMSNorm and rotary embeddings compute in float64 (:func:`~worker_agent.runtime.model.hf_float64.keep_float64`,
as the adapter does in training); the family's own code rounds them through float32, which leaves the
logits 1e-8 to 1e-7 apart and would hide anything smaller.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.model.hf_adapter import hf_layers
from worker_agent.runtime.model.hf_export import checkpoint_state, no_progress_bars, state_dtype
from worker_agent.runtime.model.hf_float64 import keep_float64
from worker_agent.runtime.numerics.batch import run_layers
from worker_agent.runtime.storage.checkpoint import Checkpoint

CHECK_SAMPLES = 2
CHECK_POSITIONS = 16
FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-4


def default_tolerance(dtype: torch.dtype) -> float:
    """Float64 agrees to rounding, far below 1e-10 at any depth that fits a CPU; float32 (and below) to
    its own rounding, which grows with the model: a large model may need ``--tolerance`` raised."""
    return FLOAT64_TOLERANCE if dtype == torch.float64 else FLOAT32_TOLERANCE


@dataclass(frozen=True)
class ExportCheck:
    """How far the export's logits are from the checkpoint model's, where, and what else does not match."""

    dtype: torch.dtype
    shape: tuple[int, ...]  # of the token ids
    max_abs: float
    max_rel: float  # max_abs over the largest logit's magnitude
    where: str  # the largest difference: "sample 1, position 3, vocabulary entry 40"
    weight: str  # the export's weight furthest from the checkpoint's: "NAME (max_abs X)"
    problems: tuple[str, ...]  # keys from_pretrained did not match, a forward that failed

    def failures(self, tolerance: float) -> list[str]:
        """One line per reason the export fails the check; none when it passes."""
        failures = list(self.problems)
        if not self.max_abs <= tolerance:  # NaN fails too
            failures.append(
                f"max_abs {self.max_abs:.3e} > tolerance {tolerance:g}, largest at {self.where}; "
                f"the weight that differs most: {self.weight}"
            )
        return failures


def check_ids(config: Any) -> torch.Tensor:
    """``[2, 16]`` token ids from a fixed generator (fewer positions if the model has fewer)."""
    positions = getattr(config, "max_position_embeddings", None) or CHECK_POSITIONS
    gen = torch.Generator().manual_seed(0)
    return torch.randint(int(config.vocab_size), (CHECK_SAMPLES, min(CHECK_POSITIONS, int(positions))), generator=gen)


def check_export(ckpt: Checkpoint, config: Any, out: Path) -> ExportCheck:
    """Compare ``out``'s logits with the checkpoint's model's (see the module docstring)."""
    if not out.is_dir() or not (out / "config.json").is_file():
        raise UserInputError(
            f"{out} holds no Hugging Face model (no config.json): name the directory export wrote, "
            "or a new one to export into"
        )
    params, state = checkpoint_state(ckpt, config)
    dtype = state_dtype(state)
    export, problems = _load_export(out, dtype)
    if getattr(export.config, "model_type", None) != config.model_type:
        problems.append(f"the export is a {export.config.model_type} model, the checkpoint a {config.model_type}")
    ids = check_ids(config)
    ours = _spotmorph_logits(config, params, dtype, ids)
    try:
        with torch.no_grad():
            theirs: torch.Tensor | None = export(ids).logits
    except Exception as exc:  # another model's export: ids out of its vocabulary, other shapes
        problems.append(f"the export's model fails on the check's token ids: {_first_line(exc)}")
        theirs = None
    if theirs is not None and theirs.shape != ours.shape:
        problems.append(f"the export's logits are shaped {list(theirs.shape)}, the checkpoint's {list(ours.shape)}")
        theirs = None
    max_abs, where = _largest(theirs, ours)
    scale = float(ours.abs().max())
    return ExportCheck(
        dtype=dtype,
        shape=tuple(ids.shape),
        max_abs=max_abs,
        max_rel=max_abs / scale if scale > 0 else max_abs,
        where=where,
        weight=_worst_weight(export, state),
        problems=tuple(problems),
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _load_export(out: Path, dtype: torch.dtype) -> tuple[Any, list[str]]:
    """The export as ``from_pretrained`` gives it, in ``dtype`` and eval mode; keys it did not match."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # untyped in transformers' stubs
    try:
        with no_progress_bars():
            model, info = auto.from_pretrained(str(out), dtype=dtype, local_files_only=True, output_loading_info=True)
    except Exception as exc:
        raise UserInputError(
            f"{out}: from_pretrained cannot load it ({_first_line(exc)}); export again into a new directory"
        ) from None
    model.eval()
    if dtype == torch.float64:
        keep_float64(model)
    problems = [
        f"{kind.replace('_', ' ')} in the export: {sorted(map(str, keys))[:3]}"
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
        if (keys := info.get(kind))
    ]
    return model, problems


def _spotmorph_logits(config: Any, params: dict[str, torch.Tensor], dtype: torch.dtype, ids: torch.Tensor) -> Any:
    """The checkpoint's model as the trainer runs it: the adapter's layers (named as the checkpoint names
    them, a tied parameter by its first use), in ``dtype``, with the checkpoint's parameters, in eval mode."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM
    layers = hf_layers(auto.from_config(copy.deepcopy(config)))
    modules = nn.ModuleList([module for _, module in layers]).to(dtype).eval()
    named: dict[int, tuple[str, nn.Parameter]] = {}
    for layer, module in layers:
        for name, param in module.named_parameters(remove_duplicate=False):
            named.setdefault(id(param), (f"{layer}.{name}", param))
    with torch.no_grad():
        for name, param in named.values():
            if name not in params:
                raise UserInputError(f"the checkpoint holds no {name!r}: it was written for another model")
            param.copy_(params[name])
        return run_layers(list(modules), ids)


def _largest(theirs: torch.Tensor | None, ours: torch.Tensor) -> tuple[float, str]:
    """The largest absolute difference of the logits and where it is (inf when there is nothing to compare)."""
    if theirs is None:
        return math.inf, "no comparable logits"
    diff = (theirs - ours).abs().nan_to_num(nan=math.inf)
    sample, position, entry = (int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    return float(diff.max()), f"sample {sample}, position {position}, vocabulary entry {entry}"


def _worst_weight(export: Any, state: dict[str, torch.Tensor]) -> str:
    """The export's tensor furthest from the checkpoint's parameter of the same name."""
    theirs = export.state_dict()
    worst, name = -1.0, "none comparable"
    for key, tensor in state.items():
        other = theirs.get(key)
        if other is None or other.shape != tensor.shape:
            continue
        gap = float((other.double() - tensor.double()).abs().max())
        gap = math.inf if math.isnan(gap) else gap
        if gap > worst:
            worst, name = gap, key
    return f"{name} (max_abs {worst:.3e})" if worst >= 0 else name
