"""How a trainer process ends, as its exit status: the launcher, the agent and the tests read these."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """A trainer's exit status. A signal shows up as a negative status instead (``-9``: SIGKILL)."""

    SUCCEEDED = 0  # reached its last step, or stopped when asked; either way its checkpoint is written
    ABORTED = 1  # anything else, notably a dead peer (closed connection, collective timeout)
    USER_ERROR = 2  # bad input: entrypoint, spec, layout, a checkpoint of another job or a damaged one named
    CHECKPOINT_NOT_WRITTEN = 3  # a checkpoint could not be written (disk full); the previous one is kept
    LEASE_EXPIRED = 4  # its agent stopped renewing the lease (cut off from the controller, or frozen): no checkpoint
    FENCED = 5  # a newer generation raised the checkpoint dir's fence: the controller moved past this one
    NOT_STARTED = 127  # the agent could not even create the process (no such interpreter)
