"""What becomes of a decision that fails: the report that caused it is refused, or the loop is down for now.

The API maps :class:`Refused` to INVALID_ARGUMENT and :class:`DecisionsFailed` and :class:`OutOfDescriptors`
to UNAVAILABLE (retry later); the health port tells the gRPC health service whether decisions are being made.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

HealthPort = Callable[[bool], None]  # called with False when the decision loop starts failing, True once it recovers


class Refused(ValueError):
    """A report or request whose decision failed while the others' did not: nothing of it was kept."""


class DecisionsFailed(RuntimeError):
    """No decision could be made (the failure is not one report's or one job's); retried every tick."""


class NotLeader(DecisionsFailed):
    """This controller no longer leads (another took the lease): nothing was written; ask the leader."""


class OutOfDescriptors(RuntimeError):
    """The controller's process (or the machine) has no file descriptor left: not the caller's fault, retry."""

    def __init__(self, what: str, error: OSError) -> None:
        name = errno.errorcode.get(error.errno or 0, "EMFILE")
        super().__init__(
            f"the controller has run out of file descriptors ({name}) while opening {what}: not a problem of this "
            "request; retry later, and raise the controller's descriptor limit (LimitNOFILE in its systemd unit)"
        )


def check_descriptors(what: str, error: OSError) -> None:
    """Raise :class:`OutOfDescriptors` when ``error`` says the process or the system ran out of descriptors."""
    if error.errno in (errno.EMFILE, errno.ENFILE):
        raise OutOfDescriptors(what, error) from error


def describe(error: BaseException) -> str:
    """An error in one line for a message: its type and the start of its text."""
    text = str(error).splitlines()[0][:200] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
