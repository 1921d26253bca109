"""A trainer keeps the memory it frees for its next step, instead of handing it back to the kernel.

A training step on the CPU allocates and frees the same large tensors every step (activations, gradients,
the flattened all-reduce buffer, the optimizer's temporaries). glibc's malloc serves an allocation above its
mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps it on ``free``, and trims the heap's free top,
so every step faults its memory in again, page by page, each page zeroed by the kernel: measured here on a 43M
GPT-2, 1x2 over gloo on 2 cores, about 240,000 minor faults (0.9 GB) a step, a quarter of the step's time, and
the first step after a morph faulted 240 MB more than the steady ones. With mmap off for allocations and the
trim threshold out of reach, freed memory stays in the heap and the next step reuses it: no faults once the
first step has run. The price: a trainer's resident memory stays at its peak (it would reach it every step
anyway). Only glibc has these knobs; elsewhere nothing changes. ``SPOTMORPH_MALLOC=system`` keeps glibc's
defaults (the baseline of ``bench/allocator_bench.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from worker_agent.runtime.errors import NodeUnfit

ENV = "SPOTMORPH_MALLOC"
MODES = ("keep", "system")
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
NEVER_TRIM = -1  # mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"


def keep_freed_memory() -> bool:
    """Tune this process's malloc as the module says; True when it was tuned (glibc, mode ``keep``): memory it
    frees then stays mapped, touched, for its next allocations (a warm trainer keeps the answer: what it builds
    ahead is then worth touching). A mode that is neither is this node's setting, not the job's:
    :class:`NodeUnfit`."""
    mode = os.environ.get(ENV, "keep")
    if mode not in MODES:
        raise NodeUnfit(f"{ENV}={mode[:40]!r} on this node is not one of {', '.join(MODES)}; unset it (keep)")
    if mode == "system":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: another libc's mallopt takes other numbers)
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
