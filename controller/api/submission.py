"""A SubmitJob checked at the edge: the spec's fields, its paths, and the files the controller will read.

Paths must be absolute and normalised (the client resolves a spec file's relative paths; a raw
request's relative path would be read against the controller's working directory). The profile must
be a regular file of bounded size holding a valid profile, a file entrypoint an existing regular
``.py`` file, a module entrypoint's top-level package findable (without importing anything).
"""

from __future__ import annotations

import importlib.util
import os
import stat

from controller.shell.profiles import read_profile
from controller.spec_wire import spec_to_dict
from morphing.jobspec import JobSpec, parse_job_spec
from morphing.validation import (
    InvalidField,
    check_absolute_path,
    check_entrypoint,
    check_name,
    check_text,
    entrypoint_file,
    shown,
)
from protos.spotmorph.v1 import controller_pb2 as pb

MAX_IDEMPOTENCY_KEY = 128
MAX_JOB_NAME = 128


def checked(request: pb.SubmitJobRequest) -> tuple[JobSpec, str | None]:
    """The request's spec and idempotency key, every field checked (nothing read from disk yet)."""
    spec = parse_job_spec(spec_to_dict(request.spec))
    key = check_text("idempotency_key", request.idempotency_key, MAX_IDEMPOTENCY_KEY) or None
    check_name("name", spec.name, MAX_JOB_NAME)
    check_entrypoint("entrypoint", spec.entrypoint)
    check_absolute_path("checkpoint_dir", spec.checkpoint_dir)
    if spec.profile is None:
        raise InvalidField("profile", "missing; the controller plans with it, measure one with `spotmorph profile`")
    check_absolute_path("profile", spec.profile)
    return spec, key


def check_files(spec: JobSpec) -> None:
    """The files the controller and its agents will read exist and are what they should be (blocking I/O)."""
    file = entrypoint_file(spec.entrypoint)
    if file is None:
        top = spec.entrypoint.rpartition(":")[0].split(".")[0]
        try:
            found = importlib.util.find_spec(top)  # a top-level name: found without importing anything
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise InvalidField("entrypoint", f"module {shown(top)} cannot be found on the controller")
    else:
        try:
            mode = os.stat(file).st_mode
        except OSError:
            raise InvalidField("entrypoint", f"file {shown(file, 200)} does not exist on the controller") from None
        if not stat.S_ISREG(mode):
            raise InvalidField("entrypoint", f"{shown(file, 200)} is not a regular file; name a .py file")
    read_profile(spec.profile)
