"""The one error type for bad input from a user: the message names the problem and the fix.

It lives in the bottom layer so every component can raise it; the ``spotmorph`` command turns it
into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class UserInputError(ValueError):
    """Bad input from a user (a file, a flag, a spec); ``str(err)`` is the whole explanation."""


def describe_validation_error(error: ValidationError, what: str, docs: str) -> str:
    """One line naming the first failing field (``layers[3].forward_seconds.2``) and what it needs.

    ``docs`` says where the format is described, for a missing field (each format has its own page).
    """
    first = error.errors()[0]
    location = ""
    for part in first["loc"]:
        location += f"[{part}]" if isinstance(part, int) else (f".{part}" if location else str(part))
    message = first["msg"]
    if first["type"] == "missing":
        message = f"missing; add it ({docs})"
    elif first["type"] == "extra_forbidden":
        message = "unknown field; remove it or fix its spelling"
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{what} field {location or '(top level)'}: {message}{suffix}"
