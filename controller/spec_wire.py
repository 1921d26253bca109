"""The job spec on the wire: shared by the client (which sends it) and the API (which receives it)."""

from __future__ import annotations

from typing import Any

from morphing.jobspec import JobSpec
from protos.spotmorph.v1 import controller_pb2 as pb


def spec_to_dict(message: pb.JobSpec) -> dict[str, Any]:
    """The wire spec as a plain dict for pydantic; optional fields left unset are left out (defaults apply)."""
    return {
        field.name: getattr(message, field.name)
        for field in message.DESCRIPTOR.fields
        if not field.has_presence or message.HasField(field.name)  # type: ignore[arg-type]
    }


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    values = {k: v for k, v in spec.model_dump().items() if v is not None}
    return pb.JobSpec(**values)
