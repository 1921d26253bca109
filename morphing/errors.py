"""The one error type for bad input from a user: the message names the problem and the fix.

It lives in the bottom layer so every component can raise it; the ``spotmorph`` command turns it
into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class UserInputError(ValueError):
    """Bad input from a user (a file, a flag, a spec); ``str(err)`` is the whole explanation."""


MAX_LISTED = 5  # problems one message lists; more are counted


def describe_validation_error(error: ValidationError, what: str, docs: str, fields: Collection[str] = ()) -> str:
    """One line naming every failing field (``layers[3].forward_seconds.2``) and what it needs, a misspelt
    one first with its likely spelling (``global_bach: unknown field; did you mean global_batch?``).

    ``docs`` says where the format is described, for a missing field (each format has its own page);
    ``fields`` are top-level names an unknown top-level field may be a misspelling of (those not given).
    """
    problems = error.errors()
    guesses = _guesses(problems, fields)
    meant = {(*loc[:-1], guess) for loc, guess in guesses.items()}  # missing fields a guess accounts for
    lines: list[tuple[bool, str]] = []  # (a misspelling, its text)
    docs_said = False
    for problem in problems:
        loc = tuple(problem["loc"])
        message = problem["msg"]
        if problem["type"] == "missing":
            if loc in meant:
                continue
            message = "missing; add it" if docs_said else f"missing; add it ({docs})"
            docs_said = True
        elif problem["type"] == "extra_forbidden":
            guess = guesses.get(loc)
            message = (
                f"unknown field; did you mean {guess}?" if guess else "unknown field; remove it or fix its spelling"
            )
        lines.append((loc in guesses, f"field {_location(loc)}: {message}"))
    lines.sort(key=lambda line: not line[0])  # stable: misspellings first, the rest in pydantic's order
    texts = [text for _, text in lines]
    more = len(texts) - MAX_LISTED
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else ""
    joined = texts[0]
    for text in texts[1:MAX_LISTED]:
        joined += f"{' ' if joined.endswith(('?', '.')) else '. '}Also {text}"
    return f"{what} {joined}{suffix}"


def _location(loc: tuple[int | str, ...]) -> str:
    location = ""
    for part in loc:
        location += f"[{part}]" if isinstance(part, int) else (f".{part}" if location else str(part))
    return location or "(top level)"


def _guesses(problems: Sequence[Mapping[str, Any]], fields: Collection[str]) -> dict[tuple[int | str, ...], str]:
    """The likely spelling of each unknown field: a missing field beside it, else (top level) one of ``fields``."""
    missing: dict[tuple[int | str, ...], list[str]] = {}
    for problem in problems:
        if problem["type"] == "missing":
            missing.setdefault(tuple(problem["loc"][:-1]), []).append(str(problem["loc"][-1]))
    guesses: dict[tuple[int | str, ...], str] = {}
    for problem in problems:
        loc = tuple(problem["loc"])
        if problem["type"] != "extra_forbidden" or not loc:
            continue
        name, parent = str(loc[-1]), loc[:-1]
        close = difflib.get_close_matches(name, missing.get(parent, []), n=1) or (
            difflib.get_close_matches(name, [f for f in fields if f != name], n=1) if not parent else []
        )
        if close:
            guesses[loc] = close[0]
    return guesses
