"""The ``spotmorph`` command, and the names a user's model file imports.

``spotmorph.ModelSpec``, ``spotmorph.Dropout`` and its helpers (the runtime's, re-exported), ``spotmorph.data`` (token
files) and ``spotmorph.hf`` (Hugging Face models). The names load lazily: importing torch here would slow
down every ``spotmorph`` command, ``spotmorph plan`` included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker_agent.runtime.model.model_api import Dropout, ModelSpec, layout_free_dropout, make_dropout_layout_free

__all__ = ["Dropout", "ModelSpec", "layout_free_dropout", "make_dropout_layout_free"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from worker_agent.runtime.model import model_api

        return getattr(model_api, name)
    raise AttributeError(f"module 'spotmorph' has no attribute {name!r}")
