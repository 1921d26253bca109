"""Hugging Face decoder-only language models as a :class:`ModelSpec`, cut at their decoder layers.

The layers are ``embed`` (token and position embeddings, embedding dropout), ``layer0`` .. ``layerN-1``
(the model's own decoder blocks, its ``_no_split_modules``) and ``head`` (final norm and LM head). Between
stages they pass ``(hidden states, position ids)``: the position ids come from the shapes (or from the
dataset, when its input is ``(input ids, position ids)``), rotary embeddings are recomputed from them in
each block, and the causal mask is built from the shapes inside attention, so no mask crosses a stage.
Tied embedding and head share one ``nn.Parameter``, which the runtime keeps tied across stages. Where a
family keeps these parts is a row of :data:`FAMILIES`; another decoder-only family is one more row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.model.hf_attention import make_hf_attention_layout_free
from worker_agent.runtime.model.hf_float64 import keep_float64
from worker_agent.runtime.model.model_api import Dataset, ModelSpec, OptimizerFactory, make_dropout_layout_free
from worker_agent.runtime.numerics.batch import IGNORE_INDEX, NORMALIZATIONS


@dataclass(frozen=True)
class Family:
    """Attribute paths of one model family, from the ``*ForCausalLM`` object."""

    base: str  # the decoder stack (``model.transformer`` / ``model.model``)
    tokens: str  # token embedding, under base
    layers: str  # the decoder blocks (an nn.ModuleList), under base
    norm: str  # final norm, under base
    positions: str | None = None  # learned absolute position embedding, under base
    dropout: str | None = None  # embedding dropout, under base
    rotary: str | None = None  # rotary embedding module computing (cos, sin), under base
    head: str = "lm_head"  # on the causal-LM object


_LLAMA_LIKE = Family(base="model", tokens="embed_tokens", layers="layers", norm="norm", rotary="rotary_emb")
FAMILIES: dict[str, Family] = {
    "gpt2": Family(base="transformer", tokens="wte", layers="h", norm="ln_f", positions="wpe", dropout="drop"),
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
}


class Embed(nn.Module):
    """Token (+ absolute position) embedding and embedding dropout; returns (hidden, position ids)."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None, dropout: nn.Module | None) -> None:
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.dropout = dropout

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(input_ids.shape[0], 1)
        hidden = self.tokens(input_ids)
        if self.positions is not None:
            hidden = hidden + self.positions(position_ids)
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        return hidden, position_ids


class Decoder(nn.Module):
    """One decoder block of the model, called the way the model calls it, with no mask and no cache."""

    def __init__(self, block: nn.Module, rotary: nn.Module | None) -> None:
        super().__init__()
        self.block = block
        self.rotary = rotary  # shared by every block; it has no parameters, only constant buffers

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        extra: dict[str, Any] = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(hidden, position_ids)
        out = self.block(hidden, attention_mask=None, position_ids=position_ids, **extra)
        return (out[0] if isinstance(out, tuple) else out), position_ids


class Head(nn.Module):
    """Final norm and LM head: logits ``[batch, seq, vocab]``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))  # type: ignore[no-any-return]


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per target, ``[batch, seq]``; ignored targets (-100) give 0."""
    flat = nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return flat.view(targets.shape)


def sample_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over each sample's non-ignored targets, ``[batch]``."""
    counts = (targets != IGNORE_INDEX).sum(dim=1).clamp(min=1)
    return token_losses(logits, targets).sum(dim=1) / counts.to(logits.dtype)


def _get(obj: Any, path: str | None, what: str) -> Any:
    if path is None:
        return None
    for part in path.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"{type(obj).__name__} has no {part!r} ({what}); update FAMILIES for this model")
        obj = getattr(obj, part)
    return obj


def load_model(model: nn.Module | str | Path) -> nn.Module:
    """A model object as given, or one loaded from a local ``save_pretrained`` directory (no download)."""
    if isinstance(model, nn.Module):
        return model
    from transformers import AutoModelForCausalLM

    path = Path(model)
    if not path.is_dir():
        raise UserInputError(f"{path} is not a directory written by save_pretrained")
    try:
        loaded: nn.Module = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise UserInputError(f"cannot load a causal language model from {path}: {exc}") from exc
    return loaded


def hf_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``embed``, ``layer0`` .. ``layerN-1``, ``head`` of a supported causal LM, attention made layout-free."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise UserInputError(
            f"{type(model).__name__} (model_type {model_type!r}) has no entry in spotmorph's Hugging Face adapter; "
            f"supported: {', '.join(sorted(FAMILIES))} (add a row to worker_agent.runtime.model.hf_adapter.FAMILIES)"
        )
    base = _get(model, family.base, "decoder stack")
    blocks = list(_get(base, family.layers, "decoder layers"))
    splits = set(getattr(model, "_no_split_modules", None) or [])
    if splits and any(type(b).__name__ not in splits for b in blocks):
        raise UserInputError(f"{type(model).__name__}: the decoder layers are not its _no_split_modules {splits}")
    tokens = _get(base, family.tokens, "token embedding")
    lm_head = _get(model, family.head, "LM head")
    if getattr(config, "tie_word_embeddings", False) and lm_head.weight is not tokens.weight:
        lm_head.weight = tokens.weight
    make_hf_attention_layout_free(model)
    keep_float64(model)  # RMSNorm and rotary embeddings compute in float64 in a float64 job
    rotary = _get(base, family.rotary, "rotary embedding")
    layers: list[tuple[str, nn.Module]] = [
        ("embed", Embed(tokens, _get(base, family.positions, "position embedding"), _get(base, family.dropout, "")))
    ]
    layers += [(f"layer{i}", Decoder(block, rotary)) for i, block in enumerate(blocks)]
    layers.append(("head", Head(_get(base, family.norm, "final norm"), lm_head)))
    make_dropout_layout_free(layers)
    return layers


def hf_parameter_name(model_type: str, name: str) -> str | None:
    """The Hugging Face state-dict name of the adapter's parameter ``name`` (``layer3.block.mlp.c_fc.weight``
    -> ``transformer.h.3.mlp.c_fc.weight``), from the family's row alone; None if it is no such name."""
    family = FAMILIES.get(model_type)
    layer, _, rest = name.partition(".")
    if family is None or not rest:
        return None
    base = family.base
    prefixes: dict[str, str | None] = {
        "embed.tokens": f"{base}.{family.tokens}",
        "embed.positions": f"{base}.{family.positions}" if family.positions else None,
        "head.norm": f"{base}.{family.norm}",
        "head.lm_head": family.head,
    }
    if layer.startswith("layer") and layer[5:].isdigit() and rest.startswith("block."):
        return f"{base}.{family.layers}.{int(layer[5:])}.{rest[len('block.') :]}"
    sub, _, leaf = rest.partition(".")
    prefix = prefixes.get(f"{layer}.{sub}")
    return f"{prefix}.{leaf}" if prefix and leaf else None


def default_optimizer(lr: float = 3e-4, weight_decay: float = 0.1) -> OptimizerFactory:
    """AdamW with weight decay on matrices only (not on norms, biases)."""

    def build(params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        decay = [p for _, p in params if p.dim() >= 2]
        rest = [p for _, p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95))

    return build


def _keep_optimizer_lr(factory: OptimizerFactory) -> OptimizerFactory:
    """Without an ``lr_schedule`` the optimizer's own learning rates stay: each group's ``lr_scale``
    becomes its ``lr`` and the schedule is the constant 1."""

    def build(params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        opt = factory(params)
        for group in opt.param_groups:
            group["lr_scale"] = group.get("lr_scale", 1.0) * group["lr"]
        return opt

    return build


def causal_lm_spec(
    model: nn.Module | str | Path,
    dataset: Dataset,
    *,
    eval_dataset: Dataset | None = None,
    optimizer: OptimizerFactory | None = None,
    lr_schedule: Callable[[int], float] | None = None,
    clip_grad_norm: float | None = 1.0,
    loss_normalization: str = "token",
) -> ModelSpec:
    """A :class:`ModelSpec` for a Hugging Face causal LM (an object or a local ``save_pretrained`` dir).

    ``dataset[i]`` is ``(input ids, target ids)`` of one length, targets aligned with inputs (target ``t``
    is the token after input ``t``, as :class:`TokenFileDataset` gives) and -100 where nothing is to be
    predicted; the input may also be ``(input ids, position ids)``. ``loss_normalization="token"`` (the
    default) averages over the step's predicted tokens, as Hugging Face does; ``"sample"`` averages each
    sample's tokens first. Without ``lr_schedule`` the optimizer's own learning rates are used
    (default: AdamW, lr 3e-4, weight decay 0.1 on matrices).
    """
    if loss_normalization not in NORMALIZATIONS:
        raise UserInputError(f"loss_normalization={loss_normalization!r}; use 'token' or 'sample'")
    hf_model = load_model(model)
    layers = hf_layers(hf_model)
    factory = optimizer or default_optimizer()
    if lr_schedule is None:
        factory = _keep_optimizer_lr(factory)
    config: Any = hf_model.config
    return ModelSpec(
        layers=layers,
        loss=token_losses if loss_normalization == "token" else sample_losses,
        dataset=dataset,
        optimizer=factory,
        lr_schedule=lr_schedule or (lambda step: 1.0),
        clip_grad_norm=clip_grad_norm,
        name=f"hf-{config.model_type}-{len(layers) - 2}x{getattr(config, 'hidden_size', '?')}",
        extra={"hf_config": config},
        loss_normalization=loss_normalization,
        eval_dataset=eval_dataset,
    )
