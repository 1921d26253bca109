"""Hugging Face models in ``spotmorph``: ``causal_lm_spec(model, dataset)`` returns a ``ModelSpec``.

Needs the ``hf`` extra (``pip install 'spotmorph[hf]'``); transformers is imported when a model is loaded
or its attention is switched, not before.
"""

from __future__ import annotations

from worker_agent.runtime.model.hf_adapter import (
    FAMILIES,
    Family,
    causal_lm_spec,
    default_optimizer,
    sample_losses,
    token_losses,
)
from worker_agent.runtime.model.hf_attention import make_hf_attention_layout_free

__all__ = [
    "FAMILIES",
    "Family",
    "causal_lm_spec",
    "default_optimizer",
    "make_hf_attention_layout_free",
    "sample_losses",
    "token_losses",
]
