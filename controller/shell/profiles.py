"""Reading a job's planner profile: a regular file of bounded size holding profile JSON.

A spec names its profile by path, and the controller reads it (at submit, and when it plans the job);
a path naming a device, a FIFO or a huge file must not block or exhaust the controller.
"""

from __future__ import annotations

import os
import stat

from controller.shell.failures import check_descriptors
from morphing.errors import UserInputError
from morphing.profile import Profile, parse_profile
from morphing.validation import shown

MAX_PROFILE_BYTES = 16 << 20  # a profile of 10,000 layers is about 4 MiB
FIX = "measure one with `spotmorph profile`"


def read_profile(path: str | None) -> Profile:
    """The profile at ``path``; :class:`UserInputError` naming the field ``profile`` and the fix otherwise."""
    if path is None:
        raise UserInputError(f"profile: the job names none; the controller plans with it, {FIX}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise UserInputError(f"profile: {shown(path, 200)} does not exist; {FIX}") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError):
            check_descriptors("the job's profile", exc)
        raise UserInputError(f"profile: {shown(path, 200)} cannot be read ({exc.__class__.__name__}); {FIX}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserInputError(f"profile: {shown(path, 200)} is not a regular file; {FIX}")
        if info.st_size > MAX_PROFILE_BYTES:
            raise UserInputError(
                f"profile: {shown(path, 200)} has {info.st_size} bytes, more than a profile's {MAX_PROFILE_BYTES}"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        check_descriptors("the job's profile", exc)
        raise UserInputError(f"profile: {shown(path, 200)} cannot be read ({exc.__class__.__name__}); {FIX}") from None
    finally:
        os.close(fd)
    try:
        text = raw[:MAX_PROFILE_BYTES].decode()
    except UnicodeDecodeError:
        raise UserInputError(f"profile: {shown(path, 200)} is not UTF-8 JSON; {FIX}") from None
    return parse_profile(text, what=f"profile {shown(path, 200)}")
