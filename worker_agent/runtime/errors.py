"""Errors of the runtime that the trainer reports as themselves (no traceback), kept free of torch."""


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (disk full, permissions); the previous one stays valid."""
