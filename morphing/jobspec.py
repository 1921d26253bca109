"""The job spec: one model for what a job is and how it runs, from the YAML file to the trainer.

The client validates it before submitting, the controller plans and persists it, the agent hands it to
its trainers unchanged (as ``job.json``) and ``spotmorph train`` builds it from its flags; so a field
has one name and one default everywhere. Parsing from a mapping or JSON text lives here; reading files
and checking that paths exist stays with the callers (this package does no I/O).

:meth:`JobSpec.identity_hash` names the training result in every checkpoint manifest: it covers only
the fields that change the parameters (entrypoint, global batch, seed, dtype), and its bytes must not
change, or checkpoints written before would no longer resume. ``device``, ``precision`` and
``activation_recomputation`` stay out of it: checkpoints hold the ``dtype`` master weights whatever the
device or the autocast precision, so any run of a job may change them.

``dtype`` is the type of the master parameters, the optimizer state, float inputs and checkpoints;
``precision`` is what the forward and backward compute in: ``fp32`` runs without autocast (in ``dtype``),
``bf16`` and ``fp16`` run under ``torch.autocast`` over float32 masters (fp16 with a loss scale).
``float64`` is the exactness mode and takes no autocast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from morphing.errors import UserInputError, describe_validation_error

Schedule = Literal["1f1b", "gpipe"]
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
DType = Literal["float32", "float64"]
DTYPES: tuple[DType, ...] = get_args(DType)
Device = Literal["auto", "cuda", "cpu"]
DEVICES: tuple[Device, ...] = get_args(Device)
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
OnDemandUse = Literal["allowed", "never"]
ON_DEMAND_USES: tuple[OnDemandUse, ...] = get_args(OnDemandUse)
EARLIEST_DEADLINE = datetime(2020, 1, 1, tzinfo=UTC)  # before it a deadline is a typo (a year, a unit), not a plan

SPEC_DOCS = "`spotmorph submit --schema` lists every field; docs/jobspec.md explains them"


class JobSpec(BaseModel):
    """What to train and how; the layout is the controller's business, not the user's."""

    # strict: `steps: true` or `global_batch: "8"` are mistakes, not 1 and 8
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the job's name"
    )
    entrypoint: str = Field(min_length=3, max_length=1024, description="path/file.py:function or module:function")
    global_batch: PositiveInt = Field(le=1_000_000_000, description="samples per optimizer step")
    steps: PositiveInt = Field(le=1_000_000_000, description="train until this step")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="seeds the model's initial weights and the data order")
    dtype: DType = Field(default="float32", description="master weights and checkpoints")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule")
    micro_batch_size: PositiveInt | None = Field(default=None, le=1_000_000, description="samples per micro-batch")
    checkpoint_interval: int = Field(default=50, ge=0, le=1_000_000_000, description="steps; 0: only on morphs")
    eval_interval: int = Field(
        default=0, ge=0, le=1_000_000_000, description="steps between evaluations of the eval_dataset; 0: off"
    )
    log_interval: int = Field(
        default=10,
        ge=0,
        le=1_000_000_000,
        description="steps between training lines in the trainers' log (step, loss, samples/s, layout); "
        "0: only each generation's first step and its end",
    )
    checkpoint_dir: str = Field(min_length=1, max_length=4096, description="where checkpoints go")
    keep: int = Field(default=3, ge=1, le=1000, description="committed checkpoints kept")
    background_checkpoint: bool = Field(default=False, description="write checkpoints while training goes on")
    morph_through_memory: bool = Field(
        default=True,
        description="a planned morph moves layers between the trainers in memory and writes the checkpoint in the "
        "background; false: every morph goes through the checkpoint on disk",
    )
    snapshot_interval: int = Field(
        default=1,
        ge=0,
        le=1_000_000_000,
        description="the fewest steps between peer snapshots where a stage has one replica (or all on one node): each "
        "rank copies its stage to host memory and streams it to a rank on another node, so a kill without notice loses "
        "at most one step between snapshots; the trainers time their first snapshots and widen it, all alike, where "
        "one costs more than 5% of the steps between (unless snapshot_interval_adapts is false); 0: off "
        "(docs/DESIGN.md, 'Peer snapshots')",
    )
    snapshot_interval_adapts: bool = Field(
        default=True,
        description="the trainers widen snapshot_interval, all alike, where their first snapshots cost more than 5% of "
        "the steps between; false: snapshot_interval is kept whatever it costs (a kill loses at most that many steps)",
    )
    timeout_seconds: float = Field(
        default=20.0, gt=0, le=86_400, description="start-up, checkpoint and evaluation waits (rendezvous, load, write)"
    )
    peer_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=86_400,
        description="a training step's collective: a peer silent this long is lost (keep it above a step's time)",
    )
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    profile: str | None = Field(
        default=None, min_length=1, max_length=4096, description="planner profile JSON; needed to submit"
    )
    max_pipeline_stages: PositiveInt | None = Field(default=None, le=4096)
    min_gpus: PositiveInt = Field(default=1, le=1_000_000)
    max_restarts: int = Field(default=3, ge=0, le=1000, description="trainer failures tolerated")
    device: Device = Field(default="auto", description="auto: CUDA where the trainer's node has a GPU, else CPU")
    precision: Precision = Field(default="fp32", description="compute under autocast (bf16, fp16) over fp32 masters")
    activation_recomputation: bool = Field(
        default=False, description="keep only layer inputs for backward and recompute the rest (less memory)"
    )
    exact: bool = Field(
        default=False,
        description="bitwise the same result in any layout (fp32, bf16): fixed micro-batches of micro_batch_size, "
        "gradients summed in fixed point (docs/runtime.md)",
    )

    deadline: str | None = Field(
        default=None,
        max_length=64,
        description="finish by this wall-clock time: ISO-8601 with a zone, e.g. 2027-03-01T18:00:00+01:00 or ...Z",
    )
    on_demand: OnDemandUse = Field(
        default="never",
        description="allowed: when the forecast says the deadline is at risk on spot alone, the controller asks the "
        "provider for on-demand capacity for this job (and gives it back when spot returns); never: spot only",
    )
    on_demand_max_gpus: PositiveInt | None = Field(
        default=None, le=1_000_000, description="the most on-demand GPUs this job may hold at once"
    )
    on_demand_max_dollars: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="the most this job's on-demand GPUs may cost if held to the deadline "
        "(at the controller's --on-demand-gpu-hour-price)",
    )

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_is_zoned(cls, value: Any) -> Any:
        if isinstance(value, datetime):  # YAML reads an unquoted timestamp as one
            if value.tzinfo is None:
                raise ValueError(f"{value} has no time zone; add one, e.g. {value.isoformat()}Z for UTC")
            value = value.isoformat()
        if isinstance(value, str):
            deadline_seconds(value)
        return value

    @field_validator("on_demand_max_dollars", mode="before")
    @classmethod
    def _dollars_as_float(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _on_demand_needs_a_deadline(self) -> JobSpec:
        capped = self.on_demand_max_dollars is not None or self.on_demand_max_gpus is not None
        if self.on_demand == "never" and capped:
            raise ValueError("an on-demand cap (on_demand_max_gpus, on_demand_max_dollars) needs on_demand: allowed")
        if self.on_demand == "allowed" and self.deadline is None:
            raise ValueError(
                "on_demand: allowed is for meeting a deadline: set deadline (ISO-8601 with a zone), or drop on_demand"
            )
        return self

    @field_validator("name", "entrypoint", "checkpoint_dir", "profile")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ValueError("control characters (such as NUL or a newline) are not allowed")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_shape(cls, value: str) -> str:
        target, sep, function = value.rpartition(":")
        if not sep or not target or not function.isidentifier():
            raise ValueError("use path/file.py:function or package.module:function")
        return value

    @field_validator("precision")
    @classmethod
    def _precision_needs_float32_masters(cls, value: Precision, info: ValidationInfo) -> Precision:
        dtype = info.data.get("dtype")
        if value != "fp32" and dtype is not None and dtype != "float32":
            raise ValueError(
                f"{value} computes under autocast over float32 master weights, so it needs dtype float32 "
                f"(got {dtype}); dtype float64 is the exactness mode: use it with precision fp32"
            )
        return value

    @field_validator("exact")
    @classmethod
    def _exact_fixes_the_micro_batch(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("micro_batch_size") is None:
            raise ValueError(
                "exact mode fixes the unit of gradient work: set micro_batch_size (samples per micro-batch, "
                "the same in every layout)"
            )
        if value and info.data.get("precision") == "fp16":
            raise ValueError("exact mode takes precision fp32 or bf16 (fp16's loss scale skips steps by layout)")
        return value

    def identity(self) -> dict[str, Any]:
        """The fields that define the training result (not the layout, not the target step); an exact job's
        result also depends on its micro-batch size (older identities keep their bytes)."""
        identity: dict[str, Any] = {
            "entrypoint": normalise_entrypoint(self.entrypoint),
            "global_batch": self.global_batch,
            "seed": self.seed,
            "dtype": self.dtype,
        }
        if self.exact:
            identity.update(exact=True, micro_batch_size=self.micro_batch_size)
        return identity

    def identity_hash(self) -> str:
        return identity_hash(self.identity())

    def deadline_seconds(self) -> float | None:
        """The deadline as seconds since the epoch (None: no deadline)."""
        return None if self.deadline is None else deadline_seconds(self.deadline)


def deadline_seconds(text: str) -> float:
    """An ISO-8601 time with a zone as seconds since the epoch; ValueError naming the fix otherwise."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO-8601 time; write e.g. 2027-03-01T18:00:00Z or 2027-03-01T18:00:00+01:00"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone; add one, e.g. {text}Z for UTC or {text}+01:00")
    if when < EARLIEST_DEADLINE:
        raise ValueError(f"{text!r} is before {EARLIEST_DEADLINE.year}: a deadline is a time to come; check the year")
    return when.timestamp()


def identity_hash(identity: Mapping[str, Any]) -> str:
    """SHA-256 of a job identity; a checkpoint's manifest records it beside the identity it hashes."""
    return hashlib.sha256(json.dumps(dict(identity), sort_keys=True).encode()).hexdigest()


def normalise_entrypoint(entrypoint: str) -> str:
    """The entrypoint as written, without its folder (a file moved elsewhere is the same job)."""
    target, _, func = entrypoint.rpartition(":")
    if target.endswith(".py"):
        target = PurePath(target).name
    return f"{target}:{func}"


def parse_job_spec(data: Any, what: str = "job spec") -> JobSpec:
    """A validated spec from parsed YAML/JSON; :class:`UserInputError` names the field and the fix."""
    if not isinstance(data, dict):
        raise UserInputError(f"{what}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        not_given = [name for name in JobSpec.model_fields if name not in data]  # what a misspelt key may mean
        raise UserInputError(describe_validation_error(exc, what, SPEC_DOCS, not_given)) from None


def job_spec_from_json(text: str, what: str = "job spec") -> JobSpec:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserInputError(f"{what} is not JSON: {exc}") from None
    return parse_job_spec(data, what)


def job_spec_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
