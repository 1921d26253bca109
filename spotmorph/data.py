"""Training data for ``spotmorph``: token files written by ``spotmorph data prepare``."""

from __future__ import annotations

from worker_agent.runtime.model.data import TokenFileDataset, prepare_token_file

__all__ = ["TokenFileDataset", "prepare_token_file"]
