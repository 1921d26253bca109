"""Numeric flags of the ``spotmorph local`` verbs: finite and within what the verb can use.

argparse's ``type=float`` takes ``nan``, ``inf`` and ``1e-300``; passed on, they become a ``tc``
argument it cannot parse, a sleep that raises, or a JSON body no service reads. Each verb checks its
numbers here before it touches the cluster, so a bad one is one line naming the flag (exit code 2).
"""

from __future__ import annotations

import math

from morphing.errors import UserInputError

MAX_NOTICE_SECONDS = 86_400.0  # an eviction notice of a day is already far beyond any platform's


def within(flag: str, value: float, least: float, most: float, unit: str, zero: bool = False) -> float:
    """``value`` when finite and in ``[least, most]`` (or 0 where ``zero`` allows it); a UserInputError otherwise."""
    if math.isfinite(value) and (least <= value <= most or (zero and value == 0)):
        return value
    lowest = f"0 or {least:g}" if zero else f"{least:g}"
    raise UserInputError(f"{flag} {value!r}: give {unit} from {lowest} to {most:g}")
