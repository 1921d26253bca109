"""The job spec on the client and controller side: files, ``--set`` overrides, checks of this machine.

The model itself is :class:`morphing.jobspec.JobSpec`, shared with the agent and the trainer. What
stays here needs the file system: reading a YAML file, resolving its relative paths against the file's
folder (so the controller always receives absolute paths) and checking that the entrypoint and the
profile exist.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec, parse_job_spec

MAX_SPEC_BYTES = 1 << 20  # a job spec is a page of YAML; anything this large is a mistake


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice (the second would silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise yaml.constructor.ConstructorError(None, None, f"field {key!r} is given twice (line {line})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> Any:
    """YAML with duplicate keys refused; :class:`yaml.YAMLError` for anything malformed."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def entrypoint_problem(spec: JobSpec) -> str | None:
    """Why the entrypoint cannot be found on this machine, without importing it."""
    target = spec.entrypoint.rpartition(":")[0]
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


def profile_problem(spec: JobSpec) -> str | None:
    """Why the controller could not plan this job: its profile is missing or not a file."""
    if spec.profile is None:
        return "profile: missing; the controller plans with it, measure one with `spotmorph profile`"
    if not Path(spec.profile).is_file():
        return f"profile: file {spec.profile} does not exist; measure one with `spotmorph profile`"
    return None


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``key=value`` pairs (values parsed as YAML scalars) laid over the spec's fields."""
    out = dict(data)
    for item in assignments:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserInputError(f"--set {item!r}: use key=value, e.g. --set steps=100")
        if key not in JobSpec.model_fields:
            close = difflib.get_close_matches(key, list(JobSpec.model_fields), n=1)
            guess = f"did you mean {close[0]}? " if close else ""
            raise UserInputError(f"--set {key}: unknown field; {guess}fields are {', '.join(JobSpec.model_fields)}")
        if not raw.strip():
            raise UserInputError(f"--set {key}=: give a value, e.g. --set {key}=VALUE (to drop a field, edit the file)")
        try:
            value = read_yaml(raw)
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise UserInputError(
                f"--set {item!r}: the value is not a YAML scalar ({problem}); quote it, e.g. --set '{key}=\"{raw}\"'"
            ) from None
        if isinstance(value, dict | list):
            raise UserInputError(f"--set {key}: give one value (a number or a string), not a list or a mapping")
        out[key] = value
    return out


def _resolvable(value: object) -> TypeGuard[str]:
    """A path worth resolving; anything else (empty, control characters) is left for the model to refuse."""
    return isinstance(value, str) and bool(value.strip()) and value.isprintable()


def load_spec_file(path: str, overrides: list[str] | None = None) -> JobSpec:
    """Read, override and validate a spec; relative paths are taken from the spec file's folder."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise UserInputError(
                f"job spec {path} is over {MAX_SPEC_BYTES // 1024} KiB; a spec is a page of YAML "
                "(put data and models in files it names)"
            )
        data = read_yaml(raw.decode())
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
        if _resolvable(data.get(key)):
            data[key] = str((base / data[key]).resolve())
    entry = data.get("entrypoint")
    if _resolvable(entry):
        target, sep, function = entry.rpartition(":")
        if sep and (target.endswith(".py") or "/" in target):
            data["entrypoint"] = f"{(base / target).resolve()}:{function}"
    return parse_job_spec(data, what=f"job spec {path}")
