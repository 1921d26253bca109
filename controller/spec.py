"""The job spec: YAML validated by pydantic; errors name the field and the fix.

Paths in a spec (entrypoint file, profile, checkpoint_dir) are resolved against the spec file's folder
by the client, so the controller always receives absolute paths.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from morphing.errors import UserInputError
from morphing.profile import describe_validation_error

# Fields ``--set`` may change; anything else in the spec may be set too, these are just documented.
COMMON_OVERRIDES = ("steps", "global_batch", "dtype", "checkpoint_interval", "seed", "priority")


class JobSpec(BaseModel):
    """What to train and how; the layout is the controller's business, not the user's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    entrypoint: str = Field(min_length=3, max_length=1024, description="path/file.py:function or module:function")
    global_batch: PositiveInt = Field(le=1_000_000_000, description="samples per optimizer step")
    steps: PositiveInt = Field(le=1_000_000_000, description="train until this step")
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    dtype: Literal["float32", "float64"] = "float32"
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    micro_batch_size: PositiveInt | None = Field(default=None, le=1_000_000)
    checkpoint_interval: int = Field(default=50, ge=0, le=1_000_000_000, description="steps; 0: only on morphs")
    checkpoint_dir: str = Field(min_length=1, max_length=4096)
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    profile: str = Field(min_length=1, max_length=4096, description="planner profile JSON")
    max_pipeline_stages: PositiveInt | None = Field(default=None, le=4096)
    min_gpus: PositiveInt = Field(default=1, le=1_000_000)
    max_restarts: int = Field(default=3, ge=0, le=1000, description="trainer failures tolerated")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_shape(cls, value: str) -> str:
        target, sep, function = value.rpartition(":")
        if not sep or not target or not function.isidentifier():
            raise ValueError("use path/file.py:function or package.module:function")
        return value

    def entrypoint_problem(self) -> str | None:
        """Why the entrypoint cannot be found on this machine, without importing it."""
        target = self.entrypoint.rpartition(":")[0]
        if target.endswith(".py") or "/" in target:
            if not Path(target).is_file():
                return f"entrypoint: file {target} does not exist"
            return None
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return f"entrypoint: module {target} cannot be found"
        return None

    def profile_problem(self) -> str | None:
        if not Path(self.profile).is_file():
            return f"profile: file {self.profile} does not exist; measure one with `spotmorph profile`"
        return None


def parse_spec(data: Any, what: str = "job spec") -> JobSpec:
    """A validated spec from parsed YAML/JSON; :class:`UserInputError` names the field."""
    if not isinstance(data, dict):
        raise UserInputError(f"{what}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise UserInputError(describe_validation_error(exc, what)) from None


def spec_from_json(text: str) -> JobSpec:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserInputError(f"job spec is not JSON: {exc}") from None
    return parse_spec(data)


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``key=value`` pairs (values parsed as YAML scalars) laid over the spec's fields."""
    out = dict(data)
    for item in assignments:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserInputError(f"--set {item!r}: use key=value, e.g. --set steps=100")
        if key not in JobSpec.model_fields:
            raise UserInputError(f"--set {key}: unknown field; fields are {', '.join(JobSpec.model_fields)}")
        out[key] = yaml.safe_load(raw) if raw else ""
    return out


def load_spec_file(path: str, overrides: list[str] | None = None) -> JobSpec:
    """Read, override and validate a spec; relative paths are taken from the spec file's folder."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise UserInputError(f"job spec {path} not found; try examples/tiny_gpt.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"job spec {path} cannot be read ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        raise UserInputError(f"job spec {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"job spec {path}: expected a mapping of fields")
    data = apply_overrides(data, overrides or [])
    base = file.resolve().parent
    for key in ("profile", "checkpoint_dir"):
        if isinstance(data.get(key), str):
            data[key] = str((base / data[key]).resolve())
    entry = data.get("entrypoint")
    if isinstance(entry, str):
        target, sep, function = entry.rpartition(":")
        if sep and (target.endswith(".py") or "/" in target):
            data["entrypoint"] = f"{(base / target).resolve()}:{function}"
    return parse_spec(data, what=f"job spec {path}")


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
