"""The controller addresses an agent knows: the comma list it is given, and which one it calls next (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.errors import UserInputError
from protos.addresses import parse_addresses
from spotmorph.cli import main
from worker_agent.agent.addresses import Controllers, after_failure
from worker_agent.commands.agent import controller_addresses

A, B, C = "a:50051", "b:50051", "c:50051"


def test_a_failure_moves_to_the_named_leader_else_the_next_address_in_turn() -> None:
    start = Controllers.of((A, B, C))
    assert after_failure(start, A, "").current == B
    assert after_failure(after_failure(after_failure(start, A, ""), B, ""), C, "").current == A, "round robin"
    named = after_failure(start, A, "z:50051")  # a leader outside the list is followed too
    assert named.current == "z:50051"
    assert after_failure(named, "z:50051", "").current == B, "then the list goes on after the one that named it"
    assert after_failure(start, A, C) == Controllers((A, B, C), C, 2), "a listed leader: the turn goes on from it"
    assert after_failure(start, A, A).current == B, "a standby naming itself names no leader"
    assert after_failure(start, B, "") == start, "a late failure of an address already left changes nothing"
    alone = Controllers.of((A,))
    assert after_failure(alone, A, "") == alone, "one address: it stays"


@given(
    st.lists(st.sampled_from([A, B, C, "d:1"]), min_size=1, max_size=4, unique=True),
    st.lists(st.tuples(st.booleans(), st.sampled_from(["", A, B, "z:9"])), max_size=30),
)
def test_the_next_address_is_a_listed_one_or_a_named_leader_and_every_listed_one_comes_in_turn(
    addresses: list[str], failures: list[tuple[bool, str]]
) -> None:
    controllers = Controllers.of(tuple(addresses))
    named: set[str] = set()
    for current_failed, leader in failures:
        failed = controllers.current if current_failed else "elsewhere:1"
        named.add(leader)
        moved = after_failure(controllers, failed, leader)
        assert moved.current in addresses or moved.current in named
        assert 0 <= moved.position < len(addresses)
        if not current_failed:
            assert moved == controllers
        controllers = moved
    tour = []
    for _ in addresses:  # failures naming no leader visit the whole list, each address once
        controllers = after_failure(controllers, controllers.current, "")
        tour.append(controllers.current)
    assert sorted(tour) == sorted(addresses)


def parse_controllers(text: str) -> tuple[str, ...]:
    return parse_addresses(text, "--controller")


def test_a_comma_list_is_parsed_in_order_each_once() -> None:
    assert parse_controllers("10.0.0.4:50051") == ("10.0.0.4:50051",)
    assert parse_controllers(" a:50051 , b:50051,a:50051") == (A, B)
    assert parse_controllers("[::1]:50051,ctl-2.internal:443") == ("[::1]:50051", "ctl-2.internal:443")
    assert parse_controllers("unix:///run/spotmorph.sock,dns:///ctl:50051") == (
        "unix:///run/spotmorph.sock",
        "dns:///ctl:50051",
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a:50051,,b:50051", "entry 2 of 3 is empty"),
        ("a:50051,", "entry 2 of 2 is empty"),
        (",a:50051", "entry 1 of 2 is empty"),
        ("a:50051,b", "entry 2 of 2 ('b') has no port; write it as b:PORT"),
        ("a:50051,:50051", "entry 2 of 2 (':50051') has no host; write it as HOST:50051"),
        ("a:http", "the address has a bad port 'http'; give a port from 1 to 65535"),
        ("a:0", "bad port '0'; give a port from 1 to 65535"),
        ("a:65536", "bad port '65536'; give a port from 1 to 65535"),
        ("::1:50051", "write it in brackets, e.g. [::1]:50051"),
        ("a b:50051", "has a space in it"),
        ("a:50051;b:50051", "has ';' in it; separate controllers with commas"),
        ("unix:", "names no target"),
    ],
)
def test_an_empty_or_malformed_entry_is_named_with_the_fix(text: str, said: str) -> None:
    with pytest.raises(UserInputError) as refused:
        parse_controllers(text)
    message = str(refused.value)
    assert message.startswith(f"--controller {text!r}: ") and said in message, message


def test_the_list_comes_from_the_flag_else_the_environment_else_nowhere() -> None:
    assert controller_addresses("a:50051,b:50051", {"SPOTMORPH_CONTROLLER": C}) == (A, B)
    assert controller_addresses(None, {"SPOTMORPH_CONTROLLER": f"{B},{C}"}) == (B, C)
    with pytest.raises(UserInputError, match=r"^SPOTMORPH_CONTROLLER 'b:50051,,c': entry 2 of 3 is empty"):
        controller_addresses(None, {"SPOTMORPH_CONTROLLER": "b:50051,,c"})
    for missing in (None, "", " "):
        with pytest.raises(UserInputError, match="no controller address: pass --controller HOST:PORT"):
            controller_addresses(missing, {} if missing is None else {"SPOTMORPH_CONTROLLER": A})


@pytest.mark.parametrize(
    ("given", "said"),
    [("a:50051,,b:50051", "entry 2 of 3 is empty; give HOST:PORT"), ("a:50051,b", "entry 2 of 2 ('b') has no port")],
)
def test_the_agent_command_exits_2_on_a_bad_entry_before_it_does_anything(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    given: str,
    said: str,
) -> None:
    monkeypatch.setenv("SPOTMORPH_AGENT_TOKEN", "t")
    assert main(["agent", "--controller", given, "--gpus", "none", "--work-dir", str(tmp_path / "agent")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spotmorph agent: error: --controller {given!r}: {said}"), err
    assert "\n" not in err and not (tmp_path / "agent").exists()
