"""The job spec on the wire, one way for all who send or read it: the client and the API send it (the
controller), the API and the agent read it (the agent's assignments and growth hints).

It lives beside the generated stubs because the controller and the agent both depend on them and on nothing
else of each other. An optional field left unset on the wire is left out of what is parsed, so it takes the
model's default (:class:`morphing.jobspec.JobSpec`) on either side.
"""

from __future__ import annotations

from typing import Any

from morphing.jobspec import JobSpec, parse_job_spec
from protos.spotmorph.v1 import controller_pb2 as pb


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    """The spec as the wire carries it (a field the spec leaves None is left unset)."""
    values = {k: v for k, v in spec.model_dump().items() if v is not None}
    return pb.JobSpec(**values)


def spec_fields(message: pb.JobSpec) -> dict[str, Any]:
    """The wire spec as a plain dict for the model; optional fields left unset are left out (defaults apply)."""
    return {
        field.name: getattr(message, field.name)
        for field in message.DESCRIPTOR.fields
        if not field.has_presence or message.HasField(field.name)  # type: ignore[arg-type]
    }


def spec_from_pb(message: pb.JobSpec, what: str = "job spec") -> JobSpec:
    """The job spec a wire message carries, checked as a spec file is; ``what`` names it in a refusal."""
    return parse_job_spec(spec_fields(message), what=what)
