"""Entrypoints that return the wrong thing (used by the bad-input tests)."""

from __future__ import annotations


def returns_dict() -> dict[str, int]:
    return {"layers": 3}


def raises() -> None:
    raise RuntimeError("model construction failed")
