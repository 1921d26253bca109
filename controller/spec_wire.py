"""The job spec on the wire: shared by the client (which sends it) and the API (which receives it)."""

from __future__ import annotations

from typing import Any

from controller.spec import JobSpec
from protos.spotmorph.v1 import controller_pb2 as pb

OPTIONAL_SPEC_FIELDS = ("micro_batch_size", "max_pipeline_stages", "min_gpus", "max_restarts")


def spec_to_dict(message: pb.JobSpec) -> dict[str, Any]:
    """The wire spec as a plain dict for pydantic; unset optional fields are left out (defaults apply)."""
    data: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.name in OPTIONAL_SPEC_FIELDS:
            if message.HasField(field.name):  # type: ignore[arg-type]
                data[field.name] = getattr(message, field.name)
        else:
            data[field.name] = getattr(message, field.name)
    for key, default in (("dtype", "float32"), ("schedule", "1f1b")):
        data[key] = data[key] or default
    return data


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    values = {k: v for k, v in spec.model_dump().items() if v is not None}
    return pb.JobSpec(**values)
