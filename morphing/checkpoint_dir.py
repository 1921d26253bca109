"""Names in a checkpoint directory that more than one side reads (one source for both).

The trainers write and raise the fence (:mod:`worker_agent.runtime.storage.fence`); the controller reads it at submit,
when it can see the directory, to refuse a job whose directory already holds another job's checkpoints.
"""

from __future__ import annotations

FENCE = ".fence"  # {"job": ID, "generation": G}: the job whose trainer raised it last owns the directory
FENCE_LOCK = ".fence.lock"
