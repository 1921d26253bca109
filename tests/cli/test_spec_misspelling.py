"""A misspelt field is named with its likely spelling, first, and every other problem of the file is listed
(``global_bach: 16`` used to say ``global_batch: missing (and 1 more problem)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from morphing.errors import UserInputError
from morphing.jobspec import parse_job_spec
from morphing.profile import parse_profile
from spotmorph.cli import main
from tests.cli.test_submit_input import EXAMPLE, spec_file, submit

GOOD: dict[str, Any] = {
    "name": "j",
    "entrypoint": "a.py:f",
    "global_batch": 8,
    "steps": 10,
    "checkpoint_dir": "/tmp/ck",
}


def problem(data: dict[str, Any]) -> str:
    with pytest.raises(UserInputError) as info:
        parse_job_spec(data, what="job spec j.yaml")
    return str(info.value)


def renamed(old: str, new: str) -> dict[str, Any]:
    return {(new if key == old else key): value for key, value in GOOD.items()}


def test_a_misspelt_required_field_names_its_spelling_and_not_a_missing_field() -> None:
    message = problem(renamed("global_batch", "global_bach"))
    assert message == "job spec j.yaml field global_bach: unknown field; did you mean global_batch?"


def test_a_misspelt_optional_field_names_its_spelling() -> None:
    message = problem({**GOOD, "checkpoint_intervall": 5})
    assert message == "job spec j.yaml field checkpoint_intervall: unknown field; did you mean checkpoint_interval?"


def test_every_problem_is_listed_the_misspelling_first() -> None:
    data = {**renamed("global_batch", "global_bach"), "dtype": "int8", "zzz": 1}
    del data["steps"]
    message = problem(data)
    assert message.startswith("job spec j.yaml field global_bach: unknown field; did you mean global_batch? Also ")
    assert "field steps: missing; add it (`spotmorph submit --schema`" in message
    assert "field dtype: Input should be 'float32' or 'float64'" in message
    assert "field zzz: unknown field; remove it or fix its spelling" in message
    assert "global_batch: missing" not in message and "more problem" not in message
    assert "\n" not in message


def test_a_field_given_is_not_suggested_for_another() -> None:
    """``steps`` is given: ``stepz`` is not taken for it (renaming would give it twice)."""
    assert "did you mean" not in problem({**GOOD, "stepz": 3})


def test_many_problems_are_counted_past_the_first_five() -> None:
    message = problem({**GOOD, **{f"x{i}": i for i in range(8)}})
    assert message.count("unknown field") == 5 and message.endswith("(and 3 more problems)")


def test_a_nested_misspelling_is_named_from_the_missing_field_beside_it() -> None:
    data = json.loads((EXAMPLE.parent / "profiles" / "tiny_gpt.json").read_text())
    data["layers"][1]["forward_second"] = data["layers"][1].pop("forward_seconds")
    with pytest.raises(
        UserInputError, match=r"layers\[1\]\.forward_second: unknown field; did you mean forward_seconds\?"
    ):
        parse_profile(json.dumps(data), "profile p.json")


def test_submit_says_it_in_one_line_and_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("global_batch: 16", "global_bach: 16")
    text = text.replace("tiny_gpt.py:build", f"{EXAMPLE.parent / 'tiny_gpt.py'}:build")
    text = text.replace("profiles/", f"{EXAMPLE.parent / 'profiles'}/").replace("../runs", str(tmp_path))
    code, err = submit(capsys, spec_file(tmp_path, text))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "field global_bach: unknown field; did you mean global_batch?" in err


def test_set_names_the_likely_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", str(EXAMPLE), "--set", "stpes=3", "--controller", "127.0.0.1:9"]) == 2
    assert "--set stpes: unknown field; did you mean steps? fields are name," in capsys.readouterr().err
