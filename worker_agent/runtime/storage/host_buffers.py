"""Host copies of a rank's state for its checkpoints, in buffers reused from one checkpoint to the next.

At a checkpoint the trainer copies every parameter and optimizer-state tensor it writes to host memory at
the step boundary, then writes the copies (in the background when the job says so) while training goes on.
Fresh host memory at every checkpoint means allocating the whole state again each time: page-locked
(pinned) memory on a GPU, about 4 GB for a 355M-parameter model with Adam. A :class:`HostPool` (one per
:class:`~worker_agent.runtime.pipeline.engine.StageRunner`) keeps the buffers and hands them out again, keyed by
(tensor name, shape, strides, dtype, pinned).

**A buffer is never handed out while a write may still read it.** :meth:`HostPool.lease` gives a
:class:`HostLease`; its buffers stay taken until :meth:`HostLease.release`, which the checkpoint writer
calls once the write that used them is over (written or failed). A lease taken while another is still out
gets fresh buffers for what the other holds (double buffering), so a copy can never overwrite a write in
flight, whatever the caller waited for. A lease never released only costs the reuse; at most one spare
buffer per key is kept, so the pool holds at most one copy of the state beyond the ones in use.

Pinned only when the source is on a GPU (the copy is then asynchronous: the caller synchronises the device
once after all copies). On a CPU the buffer is ordinary memory, and still a copy, never a view of the live
tensor.
"""

from __future__ import annotations

import threading

import torch

Key = tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype, bool]


class HostPool:
    """Host buffers kept between checkpoints; thread-safe (the writer releases from its own thread)."""

    def __init__(self) -> None:
        self._free: dict[Key, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.allocated = 0  # buffers allocated so far
        self.reused = 0  # copies made into a buffer an earlier, released lease had used

    def lease(self) -> HostLease:
        """Buffers for one checkpoint's copies: taken until :meth:`HostLease.release`."""
        return HostLease(self)

    def _take(self, key: Key) -> torch.Tensor | None:
        with self._lock:
            buffer = self._free.pop(key, None)
            if buffer is not None:
                self.reused += 1
            return buffer

    def _give_back(self, held: list[tuple[Key, torch.Tensor]]) -> None:
        with self._lock:
            for key, buffer in held:
                self._free.setdefault(key, buffer)  # one spare per key; any other is dropped


class HostLease:
    """The host copies of one checkpoint; :meth:`release` once nothing reads them any more."""

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._held: list[tuple[Key, torch.Tensor]] = []

    def copy(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor`` (``name``: the parameter, or parameter/state key, it is of)."""
        tensor = tensor.detach()
        pinned = tensor.device.type == "cuda"
        key: Key = (name, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, pinned)
        buffer = self._pool._take(key)
        if buffer is None:
            buffer = torch.empty_like(tensor, device="cpu", pin_memory=pinned)
            self._pool.allocated += 1
        self._held.append((key, buffer))
        return buffer.copy_(tensor, non_blocking=pinned)

    def release(self) -> None:
        """The write is over: its buffers may be handed out again (a second call does nothing)."""
        held, self._held = self._held, []
        self._pool._give_back(held)
