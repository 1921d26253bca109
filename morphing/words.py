"""Counts in the words people read: "1 stage", "2 stages"."""

from __future__ import annotations


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")
