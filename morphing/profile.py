"""The calibration profile: the planner's only view of a model and a cluster.

A profile is measured once per job on one GPU (``spotmorph profile``) and reused for any GPU count.
Format (JSON, ``"format": "spotmorph.profile/v1"``)::

    {
      "format": "spotmorph.profile/v1",
      "model": "tiny-gpt",                      # a name for people
      "source": "measured by ... on ...",        # where the figures come from
      "dtype": "float32",
      "gradient_bytes_per_parameter_byte": 1.0,  # gradient memory per byte of parameters
      "optimizer_bytes_per_parameter_byte": 2.0, # optimizer state per byte of parameters (Adam fp32: 2)
      "layers": [                                # in model order
        {"name": "embed",
         "forward_seconds":  {"1": 0.001, "2": 0.0018},  # per micro-batch, keyed by micro-batch size
         "backward_seconds": {"1": 0.002, "2": 0.0035},  # same keys as forward_seconds
         "output_activation_bytes_per_sample": 65536,    # what this layer sends to the next, per sample
         "parameter_bytes": 1048576,
         "activation_memory_bytes_per_sample": 262144,   # held for backward, per sample in flight
         "peak_memory_bytes_per_sample": 393216}         # optional (GPU): allocator peak of one fwd+bwd
      ],
      "cluster": {
        "gpu_memory_bytes": 17179869184,
        "intra_node_bandwidth_bytes_per_second": 1.3e11,
        "inter_node_bandwidth_bytes_per_second": 3.1e9,
        "allreduce_bandwidth_bytes_per_second": 2.5e9,  # ring bus bandwidth across nodes
        "intra_node_latency_seconds": 1e-5,
        "inter_node_latency_seconds": 5e-5
      }
    }

Every layer must be profiled at the same micro-batch sizes; the planner only considers those sizes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from morphing.errors import UserInputError, describe_validation_error
from morphing.validation import shown

PROFILE_FORMAT = "spotmorph.profile/v1"
PROFILE_DOCS = "see the format in morphing/profile.py or docs/profile.md"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LayerProfile(_Frozen):
    name: str = Field(min_length=1)
    forward_seconds: dict[PositiveInt, PositiveFloat] = Field(min_length=1)
    backward_seconds: dict[PositiveInt, PositiveFloat] = Field(min_length=1)
    output_activation_bytes_per_sample: NonNegativeInt
    parameter_bytes: NonNegativeInt
    activation_memory_bytes_per_sample: NonNegativeInt
    # Allocator peak of one forward + backward of the layer alone, per sample, parameter gradients excluded
    # (measured on a GPU): the held activations plus the workspace and temporaries. None: not measured.
    peak_memory_bytes_per_sample: NonNegativeInt | None = None

    @property
    def transient_bytes_per_sample(self) -> int:
        """What running the layer needs on top of the activations it holds for backward."""
        peak = self.peak_memory_bytes_per_sample
        return max(0, peak - self.activation_memory_bytes_per_sample) if peak is not None else 0

    @model_validator(mode="after")
    def _same_sizes(self) -> LayerProfile:
        if set(self.forward_seconds) != set(self.backward_seconds):
            raise ValueError("forward_seconds and backward_seconds must be measured at the same micro-batch sizes")
        return self


class ClusterProfile(_Frozen):
    gpu_memory_bytes: PositiveInt
    intra_node_bandwidth_bytes_per_second: PositiveFloat
    inter_node_bandwidth_bytes_per_second: PositiveFloat
    allreduce_bandwidth_bytes_per_second: PositiveFloat
    intra_node_latency_seconds: NonNegativeFloat = 0.0
    inter_node_latency_seconds: NonNegativeFloat = 0.0
    # Ranks one node runs at full speed at once; more share it (CPU cores for a CPU calibration).
    # None: every rank has a device of its own (GPUs).
    compute_slots_per_node: PositiveInt | None = None
    # Host memory a node can give the peer snapshots (docs/DESIGN.md, "Peer snapshots"); None: not known, not checked.
    host_memory_bytes: PositiveInt | None = None


class Profile(_Frozen):
    format: Literal["spotmorph.profile/v1"]
    model: str = Field(min_length=1)
    source: str = ""
    dtype: str = "float32"
    precision: str = "fp32"  # the autocast precision the layers were measured under
    gradient_bytes_per_parameter_byte: NonNegativeFloat = 1.0
    optimizer_bytes_per_parameter_byte: NonNegativeFloat = 2.0
    layers: tuple[LayerProfile, ...] = Field(min_length=1)
    cluster: ClusterProfile

    @model_validator(mode="after")
    def _common_sizes(self) -> Profile:
        sizes = set(self.layers[0].forward_seconds)
        for index, layer in enumerate(self.layers):
            if set(layer.forward_seconds) != sizes:
                raise ValueError(
                    f"layer {index} ({layer.name}) is profiled at micro-batch sizes "
                    f"{sorted(layer.forward_seconds)} but layer 0 at {sorted(sizes)}; "
                    "profile every layer at the same sizes"
                )
        return self

    @property
    def micro_batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.layers[0].forward_seconds))

    def with_gpu_memory(self, gpu_memory_bytes: int) -> Profile:
        cluster = self.cluster.model_copy(update={"gpu_memory_bytes": gpu_memory_bytes})
        return self.model_copy(update={"cluster": cluster})

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def parse_profile(text: str, what: str = "profile") -> Profile:
    """A validated profile from JSON text; :class:`UserInputError` names the bad field otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserInputError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file or re-create it with `spotmorph profile`"
        ) from exc
    if not isinstance(data, dict):
        raise UserInputError(f"{what} must be a JSON object with 'format', 'layers' and 'cluster'")
    if data.get("format") != PROFILE_FORMAT:
        raise UserInputError(
            f"{what} field format: expected {PROFILE_FORMAT!r}, got {repr(data.get('format'))[:60]}; "
            "re-create it with `spotmorph profile` or set the field"
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise UserInputError(describe_validation_error(exc, what, PROFILE_DOCS)) from exc


def layers_mismatch(profile: Profile, model_layers: Sequence[str]) -> str | None:
    """How a profile's layers differ from the names of the layers a model builds, in one clause; None if alike.

    The planner cuts the model where the profile says layers are: a profile of another model (another
    depth, or the same depth with other layers) plans stages the trainers cannot build.
    """
    names = [layer.name for layer in profile.layers]
    if names == list(model_layers):
        return None
    first = next((i for i, (a, b) in enumerate(zip(names, model_layers, strict=False)) if a != b), None)
    count = f"the profile has {len(names)} layers, the model {len(model_layers)}"
    if first is None:
        return f"{count} (the first {min(len(names), len(model_layers))} agree)"
    where = f"layer {first} is {shown(names[first])} in the profile, {shown(model_layers[first])} in the model"
    return where if len(names) == len(model_layers) else f"{count} ({where})"
