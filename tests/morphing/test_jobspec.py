"""The one job spec: identity bytes that checkpoints depend on, defaults, and errors that say where to look."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec, job_spec_from_json, parse_job_spec


def spec(**fields: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "j", "entrypoint": "examples/tiny_gpt.py:build", "global_batch": 8}
    base.update(steps=10, checkpoint_dir="/ckpt")
    return JobSpec.model_validate({**base, **fields})


# Hashes written into checkpoint manifests before the specs were merged: they must never change.
GOLDEN = [
    (
        {"entrypoint": "./examples/tiny_gpt.py:build", "global_batch": 8, "seed": 1},
        "48c19cad6cb7e3bb80e7aa86cbe2220c1e737f661cf51450990ffab64ac72aea",
    ),
    (
        {"entrypoint": "/abs/x/tiny_gpt.py:build", "global_batch": 16, "dtype": "float64"},
        "02f544d02fd2ea87258248c32857612bffc18df4eed5acc984813aadf5b35252",
    ),
    (
        {"entrypoint": "pkg.mod:fn", "global_batch": 7, "seed": 3},
        "fa6e7c3d0b1fbba4159a11c8e0c9eb505ee6e19cf67514d05edfe1fa774a0ddd",
    ),
]


@pytest.mark.parametrize(("fields", "expected"), GOLDEN)
def test_identity_hash_is_byte_identical_to_existing_checkpoints(fields: dict[str, Any], expected: str) -> None:
    assert spec(**fields).identity_hash() == expected


def test_identity_ignores_layout_run_knobs_and_target_step() -> None:
    a = spec(entrypoint="./examples/tiny_gpt.py:build", seed=1, steps=10)
    b = spec(seed=1, steps=99, checkpoint_interval=5, keep=1, background_checkpoint=True, timeout_seconds=3)
    c = spec(seed=2)
    assert a.identity_hash() == b.identity_hash() != c.identity_hash()
    assert set(a.identity()) == {"entrypoint", "global_batch", "seed", "dtype"}


def test_defaults_are_the_ones_every_component_uses() -> None:
    made = spec()
    assert (made.dtype, made.schedule, made.checkpoint_interval, made.keep) == ("float32", "1f1b", 50, 3)
    assert (made.background_checkpoint, made.timeout_seconds, made.profile) == (False, 20.0, None)


def test_json_round_trip_is_exact() -> None:
    made = spec(micro_batch_size=2, profile="/p.json", background_checkpoint=True)
    assert job_spec_from_json(made.model_dump_json()) == made


def test_a_missing_field_points_to_the_job_spec_docs_not_the_profile_docs() -> None:
    with pytest.raises(UserInputError) as info:
        parse_job_spec({"name": "j", "entrypoint": "a.py:f", "global_batch": 8, "steps": 1}, what="job spec x.yaml")
    message = str(info.value)
    assert "checkpoint_dir: missing" in message and "spotmorph submit --schema" in message
    assert "profile" not in message


def test_bad_values_name_the_field() -> None:
    with pytest.raises(UserInputError, match="field dtype"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "dtype": "int8"})
    with pytest.raises(UserInputError, match="field checkpoint_every: unknown field"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "checkpoint_every": 5})
    with pytest.raises(UserInputError, match="is not JSON"):
        job_spec_from_json("{")


def test_device_precision_and_recomputation_default_to_todays_behaviour_and_stay_out_of_the_identity() -> None:
    made = spec()
    assert (made.device, made.precision, made.activation_recomputation) == ("auto", "fp32", False)
    other = spec(device="cuda", precision="bf16", activation_recomputation=True)
    # Checkpoints hold the float32 masters whatever the device or autocast precision: any run may change them.
    assert other.identity() == made.identity() and other.identity_hash() == made.identity_hash()
    assert spec(precision="fp16", device="cpu").identity_hash() == made.identity_hash()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_precisions_need_float32_masters(precision: str) -> None:
    with pytest.raises(UserInputError, match=r"field precision: .*needs dtype float32 \(got float64\)"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "dtype": "float64", "precision": precision})
    assert spec(dtype="float64", precision="fp32").dtype == "float64"


def test_unknown_device_or_precision_names_the_field() -> None:
    with pytest.raises(UserInputError, match="field device"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "device": "tpu"})
    with pytest.raises(UserInputError, match="field precision"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "precision": "float16"})
    with pytest.raises(UserInputError, match="field activation_recomputation"):
        parse_job_spec({**json.loads(spec().model_dump_json()), "activation_recomputation": "yes"})


DEADLINE_BASE: dict[str, Any] = {
    "name": "d",
    "entrypoint": "a.py:build",
    "global_batch": 8,
    "steps": 10,
    "checkpoint_dir": "/ckpt/d",
}


def test_a_deadline_with_a_zone_is_seconds_since_the_epoch_and_on_demand_defaults_to_never() -> None:
    spec = parse_job_spec({**DEADLINE_BASE, "deadline": "2027-03-01T18:00:00+01:00"})
    assert spec.deadline_seconds() == datetime.datetime(2027, 3, 1, 17, tzinfo=datetime.UTC).timestamp()
    assert spec.on_demand == "never" and spec.on_demand_max_gpus is None and spec.on_demand_max_dollars is None
    assert parse_job_spec(DEADLINE_BASE).deadline_seconds() is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"deadline": "2027-03-01T18:00:00"}, "no time zone; add one"),
        ({"deadline": "next friday"}, "not an ISO-8601 time; write e.g."),
        ({"deadline": "1970-01-01T00:00:01Z"}, "before 2020"),
        ({"on_demand": "allowed"}, "set deadline"),
        ({"on_demand_max_gpus": 2}, "needs on_demand: allowed"),
        ({"deadline": "2027-03-01T18:00:00Z", "on_demand": "maybe"}, "'allowed' or 'never'"),
        ({"deadline": "2027-03-01T18:00:00Z", "on_demand": "allowed", "on_demand_max_dollars": 0}, "greater than 0"),
    ],
)
def test_bad_deadlines_and_on_demand_settings_name_the_field_and_the_fix(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(UserInputError, match=words):
        parse_job_spec({**DEADLINE_BASE, **fields})


def test_a_yaml_timestamp_is_taken_with_its_zone_and_refused_without_one() -> None:
    zoned = datetime.datetime(2027, 3, 1, 18, tzinfo=datetime.UTC)
    assert parse_job_spec({**DEADLINE_BASE, "deadline": zoned}).deadline_seconds() == zoned.timestamp()
    with pytest.raises(UserInputError, match="no time zone"):
        parse_job_spec({**DEADLINE_BASE, "deadline": zoned.replace(tzinfo=None)})


def test_on_demand_caps_round_trip_through_json() -> None:
    spec = parse_job_spec(
        {**DEADLINE_BASE, "deadline": "2027-03-01T18:00:00Z", "on_demand": "allowed", "on_demand_max_gpus": 4}
        | {"on_demand_max_dollars": 120}
    )
    assert spec.on_demand_max_dollars == 120.0
    assert job_spec_from_json(spec.model_dump_json()) == spec
