"""A SubmitJob checked at the edge: the spec's fields, its paths, and the files the controller will read.

Paths must be absolute and normalised (the client resolves a spec file's relative paths; a raw
request's relative path would be read against the controller's working directory). The profile must
be a regular file of bounded size holding a valid profile, a file entrypoint an existing regular
``.py`` file, a module entrypoint's top-level package findable (without importing anything).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.model import JobRecord
from controller.shell.profiles import read_profile
from morphing.checkpoint_dir import FENCE
from morphing.jobspec import JobSpec
from morphing.profile import layers_mismatch
from morphing.validation import (
    InvalidField,
    check_absolute_path,
    check_entrypoint,
    check_name,
    check_text,
    entrypoint_file,
    shown,
)
from protos.jobspec import spec_from_pb
from protos.spotmorph.v1 import controller_pb2 as pb

MAX_IDEMPOTENCY_KEY = 128
MAX_JOB_NAME = 128
MAX_MODEL_LAYERS = 100_000  # a profile is at most 16 MiB: about 40,000 layers
MAX_LAYER_NAME = 200


@dataclass(frozen=True)
class Submission:
    spec: JobSpec
    idempotency_key: str | None
    model_layers: tuple[str, ...]  # empty: the client did not say; the profile is not checked against them


def checked(request: pb.SubmitJobRequest) -> Submission:
    """The request's spec, idempotency key and model layers, every field checked (nothing read from disk yet)."""
    spec = spec_from_pb(request.spec)
    key = check_text("idempotency_key", request.idempotency_key, MAX_IDEMPOTENCY_KEY) or None
    if len(request.model_layers) > MAX_MODEL_LAYERS:
        raise InvalidField("model_layers", f"{len(request.model_layers)} names; a model has at most {MAX_MODEL_LAYERS}")
    for index, name in enumerate(request.model_layers):
        if not name:
            raise InvalidField(f"model_layers[{index}]", "empty; name every layer as the entrypoint does")
        check_text(f"model_layers[{index}]", name, MAX_LAYER_NAME)
    check_name("name", spec.name, MAX_JOB_NAME)
    check_entrypoint("entrypoint", spec.entrypoint)
    check_absolute_path("checkpoint_dir", spec.checkpoint_dir)
    if spec.profile is None:
        raise InvalidField("profile", "missing; the controller plans with it, measure one with `spotmorph profile`")
    check_absolute_path("profile", spec.profile)
    return Submission(spec, key, tuple(request.model_layers))


def retried(jobs: Iterable[JobRecord], asked: Submission) -> JobRecord | None:
    """The job an earlier call with this idempotency key and spec made (its trainers may own the directory now)."""
    key = asked.idempotency_key
    return next((j for j in jobs if key and j.idempotency_key == key and j.spec == asked.spec), None)


def check_files(spec: JobSpec, model_layers: tuple[str, ...] = ()) -> None:
    """The files the controller and its agents will read exist and are what they should be (blocking I/O);
    the profile describes the model's layers when the client named them."""
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
    check_owner(spec.checkpoint_dir)
    profile = read_profile(spec.profile)
    problem = layers_mismatch(profile, model_layers) if model_layers else None
    if problem:
        raise InvalidField(
            "profile",
            f"{shown(spec.profile or '', 200)} (of {shown(profile.model)}) was not measured for this model: {problem}; "
            "measure this one with `spotmorph profile ENTRYPOINT` (--from-config for a model larger than a device)",
        )


MAX_FENCE_BYTES = 4096


def check_owner(directory: str) -> None:
    """Where the controller sees the checkpoint directory, one whose fence names a job (its trainers wrote there)
    is refused: a job's checkpoints are resumed only by that job, and this job's pruning would delete them."""
    path = os.path.join(directory, FENCE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return  # none there (or not visible here): the controller may not mount the share
    try:
        raw = os.read(fd, MAX_FENCE_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        raw = b""
    finally:
        os.close(fd)
    try:
        owner = json.loads(raw.decode()).get("job")
    except (ValueError, AttributeError):
        owner = None
    who = f"job {shown(owner, 64)}" if isinstance(owner, str) and owner else "another job"
    raise InvalidField(
        "checkpoint_dir",
        f"{shown(directory, 200)} holds the checkpoints of {who} (its {FENCE} says so); give this job its own "
        "directory (a job's checkpoints are resumed only by that job)",
    )
