"""A profile checked against the names of a model's layers (what the controller refuses at submit)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from morphing.profile import Profile, layers_mismatch, parse_profile
from tests.controller.helpers import profile_dict

NAMES = st.lists(st.text(alphabet="abcxyz0123", min_size=1, max_size=4), min_size=1, max_size=8)


def profile_of(names: list[str]) -> Profile:
    data = profile_dict(len(names))
    data["layers"] = [{**layer, "name": name} for layer, name in zip(data["layers"], names, strict=True)]
    return parse_profile(json.dumps(data))


@given(NAMES, NAMES)
def test_a_mismatch_is_found_exactly_when_names_differ_and_says_where(profiled: list[str], built: list[str]) -> None:
    problem = layers_mismatch(profile_of(profiled), built)
    assert (problem is None) == (profiled == built)
    if problem is None:
        return
    assert "\n" not in problem
    if len(profiled) != len(built):
        assert problem.startswith(f"the profile has {len(profiled)} layers, the model {len(built)}")
    first = next((i for i, (a, b) in enumerate(zip(profiled, built, strict=False)) if a != b), None)
    if first is None:
        assert f"the first {min(len(profiled), len(built))} agree" in problem
    else:
        assert f"layer {first} is {profiled[first]!r} in the profile, {built[first]!r} in the model" in problem


def test_a_hostile_name_is_shown_cut_short() -> None:
    problem = layers_mismatch(profile_of(["embed", "head"]), ["embed", "h" * 10_000])
    assert problem is not None and len(problem) < 200 and "..." in problem
