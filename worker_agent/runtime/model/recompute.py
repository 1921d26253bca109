"""Activation recomputation: a layer keeps only its input for backward and runs again during backward.

It is per layer (the user's named layers are the checkpoint boundaries), so what is saved does not depend
on where the pipeline is cut, and it is exact: the rerun sees the same input, the same autocast state
(non-reentrant ``torch.utils.checkpoint`` restores it) and the same sample context, and layout-free
dropout is a pure function of (seed, step, sample, layer), so it draws the same masks again.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from worker_agent.runtime.model.model_api import current_sample_context, sample_context
from worker_agent.runtime.numerics.batch import Activation, as_tuple


def recomputed(layer: nn.Module, x: Activation) -> Any:
    """``layer(x)`` (``layer(*x)`` for a tuple) with only its inputs saved; backward reruns it."""
    ctx = current_sample_context()

    def contexts() -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        # Backward runs outside the micro-batch's forward: the rerun must see the samples it saw then.
        replay = (
            sample_context(ctx.seed, ctx.step, ctx.sample_ids, ctx.masks)
            if ctx is not None
            else contextlib.nullcontext()
        )
        return contextlib.nullcontext(), replay

    return checkpoint(layer, *as_tuple(x), use_reentrant=False, context_fn=contexts)
