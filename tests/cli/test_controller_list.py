"""A list of controllers (``--controller a:50051,b:50051``, SPOTMORPH_CONTROLLER, the context file): a bad entry
is one line naming it and the fix (exit 2) before any connection; when none answers, the line names them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.client.commands.common import EXIT_UNAVAILABLE
from controller.client.context import Context, read_context, write_context
from protos.addresses import parse_addresses
from spotmorph.cli import main
from tests.cli.test_controller_unreachable import free_port, one_line_naming_the_fix


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("a:50051,,b:50051", "entry 2 of 3 is empty; give HOST:PORT, or several as HOST:PORT,HOST:PORT"),
        ("a:50051,", "entry 2 of 2 is empty"),
        (",a:50051", "entry 1 of 2 is empty"),
        (" ", "the address is empty"),
        ("a:50051,b", "entry 2 of 2 ('b') has no port; write it as b:PORT, e.g. b:50051"),
        ("a:http", "the address has a bad port 'http'; give a port from 1 to 65535, e.g. a:50051"),
        ("a:0", "bad port '0'"),
        ("a:65536", "bad port '65536'"),
        ("a:", "bad port ''"),
        (":50051", "the address has no host; write it as HOST:50051, e.g. 127.0.0.1:50051"),
        ("a:50051,:50051", "entry 2 of 2 (':50051') has no host"),
        ("::1:50051", "has the IPv6 address '::1' without brackets; write it in brackets, e.g. [::1]:50051"),
        ("a:50051 b:50051", "the address has a space in it; separate controllers with commas and no spaces, e.g. "),
        ("a b:50051", "the address has a space in it"),
        ("a:50051|b:50051", "the address has '|' in it; separate controllers with commas"),
        (
            "http://a:50051",
            "the address has 'http://a', which is not a host name or an IP address; write it as HOST:PORT",
        ),
        ("[foo]:50051", "'[foo]', which is not a host name or an IP address"),
        ("unix:", "the address names no target; write e.g. unix:///run/spotmorph.sock or dns:///ctl:50051"),
    ],
)
def test_a_bad_entry_is_named_with_its_fix_and_exit_2(
    capsys: pytest.CaptureFixture[str], listed: str, expected: str
) -> None:
    assert main(["jobs", "--controller", listed, "--token", "t"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"spotmorph jobs: error: --controller {listed!r}: "), err
    assert expected in err and err.count("\n") == 1, err


def test_the_environment_and_the_context_file_are_checked_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPOTMORPH_HOME", str(tmp_path))
    monkeypatch.setenv("SPOTMORPH_CONTROLLER", "a:50051;b:50051")
    assert main(["nodes", "--token", "t"]) == 2
    assert (
        "SPOTMORPH_CONTROLLER 'a:50051;b:50051': the address has ';' in it; separate controllers with commas"
        in capsys.readouterr().err
    )
    monkeypatch.delenv("SPOTMORPH_CONTROLLER")
    write_context(Context(controller="a:50051", controllers=("a:50051", "b"), token_file=""), tmp_path)
    assert main(["nodes", "--token", "t"]) == 2
    assert f"the context file {tmp_path / 'context.json'}" in (err := capsys.readouterr().err)
    assert "entry 2 of 2 ('b') has no port" in err


def test_good_lists_keep_their_order_and_drop_repeats() -> None:
    got = parse_addresses(" a:50051 , [::1]:7,10.0.0.4:50051,a:50051", "--controller")
    assert got == ("a:50051", "[::1]:7", "10.0.0.4:50051")
    grpc_targets = "unix:///run/spotmorph.sock,dns:///ctl:50051,[fe80::1%eth0]:50051"  # as gRPC channels take them
    assert parse_addresses(grpc_targets, "--controller") == tuple(grpc_targets.split(","))


def test_the_context_file_holds_a_list_and_old_files_still_read(tmp_path: Path) -> None:
    several = Context(controller="a:1", controllers=("a:1", "b:2"), token_file="t")
    write_context(several, tmp_path)
    assert json.loads((tmp_path / "context.json").read_text())["controller"] == ["a:1", "b:2"]
    assert read_context(tmp_path) == several
    one = Context(controller="a:1", token_file="t")
    write_context(one, tmp_path)
    written = json.loads((tmp_path / "context.json").read_text())
    assert written["controller"] == "a:1" and "controllers" not in written  # what older spotmorph reads
    assert read_context(tmp_path) == one and one.addresses() == ("a:1",)
    (tmp_path / "context.json").write_text(json.dumps({"controller": [], "token_file": "t"}))
    assert read_context(tmp_path) is None  # not a context: the command then says how to name a controller


def test_when_none_answers_the_line_names_every_address(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    assert main(["cancel", "job-1", "--controller", f"{first},{second}", "--token", "t"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    one_line_naming_the_fix(err, "cancel", first)
    assert f", nor at {second} (the connection failed: " in err
    monkeypatch.setenv("SPOTMORPH_HOME", str(tmp_path))  # the same from a context file that lists both
    write_context(Context(controller=first, controllers=(first, second), token_file=""), tmp_path)
    assert main(["jobs"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert f"at {first} (from the context file {tmp_path / 'context.json'}" in err and f"nor at {second}" in err
