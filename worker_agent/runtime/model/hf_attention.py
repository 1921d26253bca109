"""Hugging Face attention whose dropout is layout-free, registered in transformers' attention interface.

Transformers' own implementations drop attention probabilities with the global random generator (SDPA's
``dropout_p``, ``nn.functional.dropout`` in eager), so a model trained 1x1 and 2x2 differs, and so does
a resumed run. This function computes the same attention, with the causal mask built from the shapes (no
mask has to cross pipeline stages), and draws the dropout mask from (seed, step, sample, module) through
:func:`worker_agent.runtime.model.model_api.layout_free_dropout`. Without dropout it calls SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.model.model_api import Dropout, layout_free_dropout

NAME = "spotmorph_layout_free"
CHILD = "spotmorph_attn_dropout"  # the Dropout child whose key names an attention module's masks


def layout_free_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[batch, heads, q, d]`` query, ``[batch, kv_heads, k, d]`` key and value -> ``[batch, q, heads, d]``."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{type(module).__name__}: attention logit soft-capping is not supported by spotmorph")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    mask = _mask(module, query, key, attention_mask, kwargs.get("sliding_window"))
    dropping = dropout > 0.0 and module.training
    if not dropping:
        out = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).contiguous(), None
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    upcast = torch.promote_types(query.dtype, torch.float32)
    probs = nn.functional.softmax(scores, dim=-1, dtype=upcast).to(query.dtype)
    drop = getattr(module, CHILD, None)
    if not isinstance(drop, Dropout):
        raise ValueError(
            f"{type(module).__name__} has attention dropout {dropout} but no layout-free dropout key; build the "
            "spec with spotmorph.hf.causal_lm_spec (or call make_hf_attention_layout_free on the model)"
        )
    probs = layout_free_dropout(probs, dropout, drop.key)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _mask(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, given: torch.Tensor | None, window: int | None
) -> torch.Tensor | None:
    """The caller's mask when there is one, else causal (and sliding-window) from the shapes."""
    if given is not None:
        return given
    q_len, k_len = query.shape[2], key.shape[2]
    if not getattr(module, "is_causal", True) or (q_len == 1 and window is None):
        return None
    rows = torch.arange(q_len, device=query.device).reshape(-1, 1) + (k_len - q_len)
    cols = torch.arange(k_len, device=query.device).reshape(1, -1)
    allowed = cols <= rows
    if window is not None:
        allowed &= cols > rows - window
    return allowed


def register() -> None:
    """Make ``NAME`` a valid ``attn_implementation`` (idempotent); transformers >= 4.51 has the registry."""
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        raise UserInputError(f"spotmorph.hf needs transformers >= 4.51 (its AttentionInterface): {exc}") from exc
    AttentionInterface.register(NAME, layout_free_attention)


def make_hf_attention_layout_free(model: nn.Module) -> list[str]:
    """Switch ``model`` (a transformers ``PreTrainedModel``) to :data:`NAME` and give each attention module
    a :class:`Dropout` child that names its masks; returns the attention modules' names."""
    register()
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(NAME)
    else:  # before transformers 4.56 the attention modules read the shared config at each call
        model.config._attn_implementation = NAME  # type: ignore[union-attr]
    if getattr(model.config, "_attn_implementation", None) != NAME:
        raise UserInputError(f"{type(model).__name__} does not let spotmorph set its attention implementation")
    names = []
    for name, sub in model.named_modules():
        if type(sub).__name__.endswith("Attention") and hasattr(sub, "config") and not hasattr(sub, CHILD):
            inner: Any = getattr(sub, "attn_dropout", None)  # GPT-2 keeps a module, Llama a float
            p = float(getattr(inner, "p", getattr(sub, "attention_dropout", 0.0)) or 0.0)
            sub.add_module(CHILD, Dropout(p).train(sub.training))
            names.append(name)
    return names
