"""Errors of the runtime that the trainer reports as themselves (no traceback), kept free of torch."""

from morphing.errors import UserInputError


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (disk full, permissions); the previous one stays valid."""


class CheckpointError(Exception):
    """A damaged checkpoint: it must not be loaded, and resume falls back to the previous one.

    Everything wrong with a checkpoint's directory, manifest or files is this one error, so no reader
    has to know the ways a manifest can be broken or hostile; the message names the problem.
    """


class ForeignCheckpoint(CheckpointError):
    """A well-formed checkpoint of another job: skipped like a damaged one, but a directory that holds
    nothing else is refused (it is someone else's, and pruning would delete it)."""


class FenceError(RuntimeError):
    """A checkpoint directory's fence refuses this writer (or cannot be read); it must not commit anything."""


class GenerationFenced(FenceError):
    """A newer generation of the job (or another job) owns the checkpoint directory now: the controller has
    moved past this generation, which stops without committing, loading or deleting anything there."""


class NodeUnfit(UserInputError):
    """Bad input that depends on this node: the job asks for what this node lacks (``device: cuda`` where
    torch sees no GPU). It exits 2 like any user error, but its class tells the controller that another
    node may run the job, so the controller leaves this node out instead of failing the job."""


class GenerationAbandoned(RuntimeError):
    """Its agent aborted the generation before it took the step it was handed from the last one's memory (a peer
    never met, or failed to start): the process holds that step again for the next generation."""
