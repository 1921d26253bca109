"""A node's GPUs in a few words (``2x H100 80GB``): one wording for the agent's log and ``spotmorph nodes``."""

from __future__ import annotations

from collections.abc import Iterable

GIB = 1 << 30


def gpu_label(name: str, memory_bytes: int) -> str:
    """The model without the vendor, with its memory when the name does not say it (NVML names often do)."""
    label = name.strip().removeprefix("NVIDIA ").strip() or "GPU"
    if "GB" in label.upper() or memory_bytes <= 0:
        return label
    return f"{label} {round(memory_bytes / GIB)}GB"


def describe_gpus(gpus: Iterable[tuple[str, int]]) -> str:
    """``(name, memory_bytes)`` per GPU as counts per model in first-seen order; ``-`` for none."""
    counts: dict[str, int] = {}
    for name, memory_bytes in gpus:
        label = gpu_label(name, memory_bytes)
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{count}x {label}" for label, count in counts.items()) or "-"
