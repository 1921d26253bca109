"""The kinds of capacity a provider can be asked for: one source for the name on every surface."""

from __future__ import annotations

from enum import StrEnum


class PoolKind(StrEnum):
    """Spot capacity may be evicted at any time; on-demand costs about five times as much and stays."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
