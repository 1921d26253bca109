"""Which user code a process has run, so that no job ever runs another job's code.

A warm trainer that built a job's model ahead (the controller's growth hint) ran that job's entrypoint: its
modules stay in ``sys.modules`` (``import helpers`` returns them to whoever asks next) and its folder on
``sys.path``, and its code may have patched anything it could reach. Such a process may only become a trainer
of the same code: the same job, the same entrypoint as written (its file resolved), the same content of that
file and the same job identity (:meth:`morphing.jobspec.JobSpec.identity_hash`). Any other job gets a process
that has run no user code. The agent keeps to this when it hands out warm trainers
(:mod:`worker_agent.agent.warming`); the warm trainer checks it again when its assignment arrives
(:mod:`worker_agent.runtime.process.warm`) and starts afresh when it does not hold.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from morphing.jobspec import JobSpec

CHUNK = 1 << 20


def code_identity(job: JobSpec, job_id: str = "") -> str:
    """A digest of the code ``job`` runs: its entrypoint (a file's path resolved, and the file's content) and
    the job's identity; ``job_id`` where the caller knows it (the agent does; a warm trainer's hint does not)."""
    target, _, function = job.entrypoint.rpartition(":")
    path, content = target, ""
    if target.endswith(".py") or "/" in target:
        resolved = Path(target).resolve()
        path, content = str(resolved), file_digest(resolved)
    fields = {"job": job_id, "path": path, "function": function, "content": content, "spec": job.identity_hash()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes; "missing" when it cannot be read (then no two readings are trusted alike
    unless both fail, and the trainer reports the missing file itself)."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return "missing"
    return digest.hexdigest()
