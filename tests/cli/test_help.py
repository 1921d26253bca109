"""Every command, subcommand, option and positional says what it is for in `--help`, and no help shows
argparse's internal ``==SUPPRESS==`` (an internal subcommand is left out of the list instead)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator

import pytest

from spotmorph.cli import build_parser


def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


PARSERS = list(walk(build_parser()[0], "spotmorph"))


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[path for path, _ in PARSERS])
def test_every_argument_has_help(path: str, parser: argparse.ArgumentParser) -> None:
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help
    ]
    assert not missing, f"`{path}`: no help for {missing}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "==SUPPRESS==" not in out.getvalue(), out.getvalue()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest for choice in action._choices_actions}
            assert all(choice.help for choice in action._choices_actions), path
            assert listed <= set(action.choices), path
