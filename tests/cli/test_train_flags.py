"""``spotmorph train``'s job flags come from the job spec's fields: one source for types, defaults and words."""

from __future__ import annotations

import argparse

import pytest

from morphing.jobspec import JobSpec
from worker_agent.commands import train


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    train.add_arguments(made)
    return made


def test_each_job_flag_has_its_fields_default_and_description() -> None:
    actions = {a.dest: a for a in parser()._actions}
    for field, aliases in train.JOB_FLAGS:
        info, action = JobSpec.model_fields[field], actions[field]
        assert f"--{field.replace('_', '-')}" in action.option_strings and set(aliases) <= set(action.option_strings)
        want = train.LOCAL_DEFAULTS.get(field, None if info.is_required() else info.default)
        assert action.default == want, field
        assert info.description and info.description in (action.help or ""), field


def test_the_flags_left_alone_give_the_specs_defaults() -> None:
    args = parser().parse_args(["m.py:build", "--global-batch", "8", "--steps", "3", "--checkpoint-dir", "/tmp/c"])
    job = train.job_spec(args)
    spec = JobSpec(name="local-train", entrypoint="m.py:build", global_batch=8, steps=3, checkpoint_dir="/tmp/c")
    assert job == spec


def test_flags_reach_their_fields_with_the_specs_types_and_choices() -> None:
    given = ["m.py:build", "--global-batch=8", "--steps=3", "--checkpoint-dir=/c", "--timeout=7", "--exact"]
    given += ["--micro-batch-size=2", "--checkpoint-every=4", "--log-every=0", "--precision=bf16"]
    job = train.job_spec(parser().parse_args(given))
    assert (job.timeout_seconds, job.exact, job.micro_batch_size) == (7.0, True, 2)
    assert (job.checkpoint_interval, job.log_interval, job.precision) == (4, 0, "bf16")
    with pytest.raises(SystemExit):
        parser().parse_args([*given, "--dtype=int8"])
